"""What the RabbitMQ and Celery tests read from their RabbitMQ node
(brokers/launch.py starts it: Debian's rabbitmq-server on free ports, its
files under target/)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "brokers"))


class Broker:
    def __init__(self, dir: Path):
        self.dir = dir
        out = subprocess.run([sys.executable, str(REPO / "brokers" / "launch.py"), "start", "rabbitmq", "--dir",
                              str(dir)], check=True, capture_output=True, text=True)
        self.info = json.loads(out.stdout.strip().splitlines()[-1])
        self.url = self.info["url"]

    def stop(self) -> None:
        subprocess.run([sys.executable, str(REPO / "brokers" / "launch.py"), "stop", "--dir", str(self.dir)],
                       check=False, capture_output=True)

    def channel(self) -> Any:
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        return connection, connection.channel()

    def source(self, name: str, quorum: bool = True, delivery_limit: int = 20) -> None:
        """The queue `name` with its dead-letter exchange `<name>.dlx` into `<name>.dlq`."""
        connection, ch = self.channel()
        ch.exchange_declare(f"{name}.dlx", "fanout", durable=True)
        ch.queue_declare(f"{name}.dlq", durable=True)
        ch.queue_bind(f"{name}.dlq", f"{name}.dlx")
        arguments: Dict[str, Any] = {"x-dead-letter-exchange": f"{name}.dlx"}
        if quorum:
            arguments.update({"x-queue-type": "quorum", "x-delivery-limit": delivery_limit})
        ch.queue_declare(name, durable=True, arguments=arguments)
        connection.close()

    def publish(self, queue: str, body: bytes, message_id: Optional[str] = None,
                headers: Optional[Dict[str, Any]] = None) -> None:
        import pika

        connection, ch = self.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queue, body, pika.BasicProperties(message_id=message_id, headers=headers,
                                                              delivery_mode=2))
        connection.close()

    def take(self, queue: str) -> List[Any]:
        """Every message of `queue` (acknowledged: taken out)."""
        connection, ch = self.channel()
        out = []
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            out.append((props, body))
        connection.close()
        return out

    def ready(self, names: List[str]) -> Dict[str, int]:
        """{name: ready messages} of those of `names` that exist, read over
        AMQP (a passive declare): milliseconds, where rabbitmqctl starts an
        Erlang VM and can take longer than a short retry delay."""
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        found = {}
        try:
            for name in names:
                ch = connection.channel()
                try:
                    found[name] = ch.queue_declare(name, passive=True).method.message_count
                except pika.exceptions.ChannelClosedByBroker as e:  # 404: no such queue
                    if e.reply_code != 404:
                        raise
                    continue
                ch.close()
        finally:
            connection.close()
        return found

    def queues(self, prefix: str) -> Dict[str, tuple]:
        """{name: (ready, unacknowledged)} of the queues named `prefix`*."""
        import launch

        settings, env = launch.rabbitmq_env(self.dir)
        out = subprocess.run([launch.rabbitmq_script("rabbitmqctl"), "-n", settings["node"], "-q", "list_queues",
                              "name", "messages_ready", "messages_unacknowledged"],
                             env=env, capture_output=True, text=True, check=True)
        found = {}
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].startswith(prefix):
                found[parts[0]] = (int(parts[1]), int(parts[2]))
        return found


def eventually(check: Callable[[], Any], timeout: float = 30, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}")
        time.sleep(0.05)
