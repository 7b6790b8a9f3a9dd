"""A webhook receiver: gunicorn (one sync worker) serving the plain WSGI app of
tests/receivers/wsgi_app.py. The sync worker does not keep connections alive: every answer
carries `Connection: close` and the connection is closed after it.

    python -m tests.receivers.gunicorn_receiver --port P --record FILE

gunicorn's own arbiter and worker run as usual (a custom application, gunicorn's documented
way to embed it); `listening on` is printed from its `when_ready` hook, once the socket is
bound (connections wait in its backlog until the worker accepts them).
"""

from __future__ import annotations

from gunicorn.app.base import BaseApplication

from tests.receivers import answers, wsgi_app


class _Application(BaseApplication):
    def __init__(self, port: int, app) -> None:
        self.port = port
        self.app = app
        super().__init__()

    def load_config(self) -> None:
        port = self.port
        for key, value in {
            "bind": f"{answers.HOST}:{port}",
            "workers": 1,
            "worker_class": "sync",
            "timeout": 30,
            "graceful_timeout": 1,
            "accesslog": None,
            "loglevel": "warning",
            "when_ready": lambda server: answers.announce(port),
        }.items():
            self.cfg.set(key, value)

    def load(self):
        return self.app


def main(argv: list[str] | None = None) -> None:
    args = answers.parse_args(__doc__.split("\n\n")[0], argv)
    app = wsgi_app.make_app(answers.Recorder(args.record))
    _Application(args.port, app).run()


if __name__ == "__main__":
    main()
