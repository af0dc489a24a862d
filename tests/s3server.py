"""A real S3-compatible server for the tests: moto's server mode, in a thread, on a free localhost port.

Its address and dummy credentials go into this process's environment, where s3fs (botocore)
reads them, as a user's would: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY.
conftest starts it before Ray, so Ray's workers (and `datapipe run` subprocesses) inherit them.
"""
from __future__ import annotations

import logging
import os
import uuid

ENVIRONMENT = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class S3Server:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)  # port 0: a free one
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.saved = {name: os.environ.get(name) for name in [*ENVIRONMENT, "AWS_ENDPOINT_URL"]}
        os.environ.update(ENVIRONMENT, AWS_ENDPOINT_URL=self.endpoint)

    def new_bucket(self) -> str:
        """A new, empty bucket: its s3:// URL."""
        from datapipe.storage import filesystem

        url = f"s3://test-{uuid.uuid4().hex[:12]}"
        filesystem(url).mkdir(url)
        return url

    def stop(self) -> None:
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self.server.stop()
