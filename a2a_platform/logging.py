"""Structured log lines: the message followed by key=value pairs taken from `extra=`."""

import logging

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_KEYS = ("task_id", "delivery_id", "binding_version", "dispatch_id", "agent", "event_seq")


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record)} {record.levelname} {record.name} {record.getMessage()}"
        extras = {
            k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")
        }
        ordered = [k for k in _KEYS if k in extras] + sorted(k for k in extras if k not in _KEYS)
        if ordered:
            base += " " + " ".join(f"{k}={extras[k]}" for k in ordered)
        if record.exc_info:
            base += "\n" + self.formatException(record.exc_info)
        return base
