"""The embedded broker (kombu's file-system transport, `make run`) never hands a consumer a
message that is still being written. kombu's own transport creates the message file under
its final name and then writes it, so a consumer polling the folder could take it half
written: the worker failed to decode it ("Unrecoverable error: JSONDecodeError") and
run_platform stopped everything (found under the API fuzzer's load; 24 of 60 reads of 4 MB
messages were empty with kombu's transport here). a2a_platform.broker_fs writes each message
under a name consumers skip and renames it whole."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from queue import Empty

from kombu import Connection

ROOT = Path(__file__).resolve().parents[2]
TRANSPORT = "a2a_platform.broker_fs:Transport"
MESSAGES = 60
PAYLOAD = {"body": "x" * 4_000_000}  # big, so a write takes long enough to be caught midway


def _options(folder: Path) -> dict:
    return {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(folder),
        "store_processed": False,
    }


def test_a_consumer_racing_a_producer_reads_every_message_whole(tmp_path):
    def produce():
        with Connection(transport=TRANSPORT, transport_options=_options(tmp_path)) as conn:
            channel = conn.channel()
            for _ in range(MESSAGES):
                channel._put("agents", PAYLOAD)

    producer = threading.Thread(target=produce)
    producer.start()
    read, failures = [], []
    with Connection(transport=TRANSPORT, transport_options=_options(tmp_path)) as conn:
        channel = conn.channel()
        while len(read) + len(failures) < MESSAGES:
            try:
                read.append(channel._get("agents"))
            except Empty:
                if not producer.is_alive() and not os.listdir(tmp_path):
                    break
            except ValueError as exc:  # JSONDecodeError: a message taken half written
                failures.append(repr(exc))
    producer.join()
    assert failures == []
    assert len(read) == MESSAGES
    assert all(message == PAYLOAD for message in read)
    assert os.listdir(tmp_path) == []  # nothing left behind, no partial file


def test_the_embedded_settings_use_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"CELERY_BROKER_URL", "A2A_PROFILE"}}
    env["A2A_VAR_DIR"] = str(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.CELERY_BROKER_URL, settings.CELERY_BROKER_TRANSPORT)",
        ],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "a2a_platform.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["filesystem://", TRANSPORT]
