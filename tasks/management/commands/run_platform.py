"""Start web (uvicorn), one Celery worker and Celery beat; Ctrl-C stops all three.

Each component can also be started alone with its conventional command (README).
"""

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand


def commands(port: str) -> dict[str, list[str]]:
    bin_dir = os.path.dirname(sys.executable)
    return {
        "web": [
            os.path.join(bin_dir, "uvicorn"),
            "a2a_platform.asgi:application",
            "--host",
            os.environ.get("HOST", "127.0.0.1"),
            "--port",
            port,
        ],
        "worker": [
            os.path.join(bin_dir, "celery"),
            "-A",
            "a2a_platform",
            "worker",
            "-Q",
            "agents,webhooks,heartbeat",
            # Threads: webhook sends are I/O-bound and one hung receiver must not stall the
            # others; executors only make short database calls.
            "-P",
            "threads",
            "-c",
            os.environ.get("A2A_WORKER_CONCURRENCY", "8"),
            "--loglevel",
            "INFO",
        ],
        "beat": [
            os.path.join(bin_dir, "celery"),
            "-A",
            "a2a_platform",
            "beat",
            "--loglevel",
            "INFO",
            "--scheduler",
            "a2a_platform.beat:PlatformScheduler",
        ],
    }


class Command(BaseCommand):
    help = "Run web, worker and beat together (the `make run` supervisor)."

    def handle(self, *args, **opts):
        port = os.environ.get("PORT", "8000")
        procs: dict[str, subprocess.Popen] = {}
        stopping = False

        def stop(signum=None, frame=None):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        for name, cmd in commands(port).items():
            # Own process group: Ctrl-C reaches us once, and we stop children in order.
            procs[name] = subprocess.Popen(cmd, start_new_session=True)
            self.stdout.write(f"started {name} (pid {procs[name].pid})")
        self.stdout.write(
            f"A2A platform on http://127.0.0.1:{port}/ (Ctrl-C stops everything); the admin at "
            f"http://127.0.0.1:{port}/admin/ (the login seed_demo printed is also in "
            f"{settings.VAR_DIR / 'admin-login.txt'} when it was generated)"
        )
        exit_code = 0
        while not stopping:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    self.stderr.write(f"{name} exited with {proc.returncode}; stopping the rest")
                    exit_code = proc.returncode or 1
                    stopping = True
                    break
            time.sleep(0.5)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for name, proc in procs.items():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"{name} did not stop in time; killing it")
                proc.kill()
                proc.wait()
        self.stdout.write("all stopped")
        sys.exit(exit_code)
