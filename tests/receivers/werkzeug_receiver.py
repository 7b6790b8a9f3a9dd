"""A webhook receiver: Werkzeug's development server (threaded, HTTP/1.1 with keep-alive)
serving the plain WSGI app of tests/receivers/wsgi_app.py.

    python -m tests.receivers.werkzeug_receiver --port P --record FILE

`werkzeug.serving.make_server` is the server `run_simple` runs, without the reloader and
banner: it binds on construction, so `listening on` is printed when connections are accepted.
"""

from __future__ import annotations

from werkzeug.serving import make_server

from tests.receivers import answers, wsgi_app


def main(argv: list[str] | None = None) -> None:
    args = answers.parse_args(__doc__.split("\n\n")[0], argv)
    app = wsgi_app.make_app(answers.Recorder(args.record))
    server = make_server(answers.HOST, args.port, app, threaded=True)
    answers.announce(args.port)
    server.serve_forever()


if __name__ == "__main__":
    main()
