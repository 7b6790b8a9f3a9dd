"""kombu's file-system transport (the embedded broker of `make run`), with messages that
appear whole.

kombu writes a message by creating its file under its final name and then writing into it;
a consumer polling the folder may move and read that file in between, get an empty or
truncated payload, and fail to decode it. Celery counts that JSONDecodeError as an
unrecoverable error: the worker stops, and run_platform stops the web and beat with it.
Seen in the embedded platform under the API fuzzer's load (the worker's log: "Unrecoverable
error: JSONDecodeError('Expecting value: line 1 column 1 (char 0)')").

Here a message is written to a name the consumers skip (`.part` after the queue's `.msg`)
and renamed to its final name once complete: a rename within a folder is atomic, so a
consumer sees either no message or all of it. Reading is kombu's.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put `payload` onto `queue`: written under a skipped name, then renamed."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = f"{final}.part"
        try:
            with open(partial, "wb") as out:
                out.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
