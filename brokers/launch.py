#!/usr/bin/env python3
"""Starts and stops the real brokers the adapters' tests run against.

    brokers/launch.py start kafka|rocketmq|rabbitmq|nats --dir DIR
    brokers/launch.py stop --dir DIR
    brokers/launch.py prepare      (what `start` would fetch or build, now)

`start` runs the broker on 127.0.0.1, on free ports, with every file under
DIR, waits until it serves, prints one JSON line with its addresses and
returns (the broker keeps running in its own session); `stop` ends every
process started under DIR. Each language's test suite starts each broker it
needs once (a session fixture, TestMain, a JUnit extension, a global setup)
and stops it at the end. Only the standard library: every suite can call it.

Where the brokers come from (nothing from outside the registries the README
names): Kafka 4 (KRaft, one combined node) and RocketMQ 5 from Maven
Central's jars (brokers/kafka/pom.xml, brokers/rocketmq/pom.xml; the class
path resolved once into target/brokers/), RabbitMQ from Debian's
rabbitmq-server (run as our own node, never the system service), NATS with
JetStream built from its Go module (brokers/nats/go.mod).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = ROOT / "target" / "brokers"
M2 = CACHE / "m2"


def free_port(around=()):
    """A free port; with `around` (offsets), one whose neighbours at those
    offsets are free too (RocketMQ's broker listens on port-2 and port+1)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if all(port_is_free(port + d) for d in around):
            return port
    raise SystemExit("no free port found")


def port_is_free(port):
    if not 1024 < port < 65536:
        return False
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_until(what, check, timeout, process=None, log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-4000:] if log and log.exists() else ""
    raise SystemExit(f"{what} did not start within {timeout} s\n{tail}")


def spawn(dir, name, argv, env=None, cwd=None):
    """Starts a process in its own session, its output in DIR/<name>.log,
    its pid recorded for `stop`."""
    log = dir / f"{name}.log"
    process = subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=env, cwd=cwd or dir,
                               start_new_session=True)
    with open(dir / "pids", "a") as f:
        f.write(f"{process.pid}\n")
    return process, log


def java():
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else (shutil.which("java") or "java")


def classpath(name):
    """The class path of brokers/<name>/pom.xml, asked of Maven once (and
    again when the pom changes)."""
    pom = HERE / name / "pom.xml"
    out = CACHE / f"{name}.classpath"
    if not out.exists() or out.stat().st_mtime < pom.stat().st_mtime:
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mvn", "-q", "-B", f"-Dmaven.repo.local={M2}", "-f", str(pom),
                        "dependency:build-classpath", f"-Dmdep.outputFile={out}"], check=True)
    return out.read_text().strip()


def listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def start_kafka(dir):
    return on_a_free_port(lambda: start_kafka_once(dir))


def start_kafka_once(dir):
    port, controller = free_port(), free_port()
    data = dir / f"data-{port}"
    props = dir / "server.properties"
    props.write_text("\n".join([
        "process.roles=broker,controller", "node.id=1",
        f"controller.quorum.bootstrap.servers=127.0.0.1:{controller}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER", "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={data}", "num.partitions=6", "auto.create.topics.enable=true",
        "offsets.topic.replication.factor=1", "offsets.topic.num.partitions=6",
        "transaction.state.log.replication.factor=1", "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1", "share.coordinator.state.topic.min.isr=1",
        # A test's group forms at once, and a member that is gone is noticed in seconds.
        "group.initial.rebalance.delay.ms=0", "group.consumer.min.session.timeout.ms=1000",
        "group.consumer.heartbeat.interval.ms=500", "group.consumer.min.heartbeat.interval.ms=500",
        "group.min.session.timeout.ms=1000",
    ]) + "\n")
    (dir / "log4j2.properties").write_text("\n".join([
        "rootLogger.level=WARN", "rootLogger.appenderRef.out.ref=OUT",
        "appender.out.type=Console", "appender.out.name=OUT",
        "appender.out.layout.type=PatternLayout", "appender.out.layout.pattern=[%d] %p %m (%c)%n",
        "logger.broker.name=kafka.server.BrokerServer", "logger.broker.level=INFO",
    ]) + "\n")
    cp = classpath("kafka")
    jvm = [java(), "-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
           f"-Dlog4j2.configurationFile={dir / 'log4j2.properties'}", "-cp", cp]
    subprocess.run(jvm + ["kafka.tools.StorageTool", "format", "--standalone", "--ignore-formatted",
                          "-t", uuid.uuid4().hex[:22], "-c", str(props)],
                   check=True, stdout=subprocess.DEVNULL)
    since = log_size(dir / "kafka.log")
    process, log = spawn(dir, "kafka", jvm + ["kafka.Kafka", str(props)])
    until_started("kafka", lambda: "to STARTED" in log.read_text(errors="replace")[since:], 120, process, log, since)
    return {"bootstrap": f"127.0.0.1:{port}"}


def start_rocketmq(dir):
    cp = classpath("rocketmq")
    # An orderly queue's lock outlives a killed consumer by lockMaxLiveTime (60 s by default) before another
    # member may take the queue: 6 s here, with the tests' clients refreshing their locks every 2 s
    # (rocketmq.client.rebalance.lockInterval) and trusting them 3 s (lockMaxLiveTime), RocketMQ's ratios.
    jvm = [java(), "-Xms128m", "-Xmx512m", "-XX:+UseG1GC", f"-Duser.home={dir}",
           f"-Drocketmq.home.dir={dir}", "-Drocketmq.broker.rebalance.lockMaxLiveTime=6000", "-cp", cp]

    def namesrv():
        port = free_port()
        (dir / "namesrv.conf").write_text(f"listenPort={port}\n")
        since = log_size(dir / "namesrv.log")
        process, log = spawn(dir, "namesrv", jvm + ["org.apache.rocketmq.namesrv.NamesrvStartup",
                                                    "-c", str(dir / "namesrv.conf")])
        # Its log, not a connection: another process may hold the port.
        booted = f"boot success. serializeType=JSON, address 0.0.0.0:{port}"
        until_started("rocketmq name server", lambda: booted in log.read_text(errors="replace"), 60, process, log,
                      since)
        return port
    namesrv_port = on_a_free_port(namesrv)

    def broker():
        port = free_port(around=(-2, 1))
        store = dir / f"store-{port}"
        (dir / "broker.conf").write_text("\n".join([
            "brokerClusterName=IdemCluster", "brokerName=idem-broker", "brokerId=0",
            f"listenPort={port}", "brokerIP1=127.0.0.1", f"namesrvAddr=127.0.0.1:{namesrv_port}",
            f"storePathRootDir={store}", f"storePathCommitLog={store / 'commitlog'}",
            "mappedFileSizeCommitLog=67108864", "mappedFileSizeConsumeQueue=600000",
            "autoCreateTopicEnable=true", "autoCreateSubscriptionGroup=true",
            "deleteWhen=04", "fileReservedTime=1", "diskMaxUsedSpaceRatio=95",
            # Redeliveries (RECONSUME_LATER) come back in seconds, not minutes.
            "messageDelayLevel=1s 1s 2s 2s 3s 3s 4s 4s 5s 5s 6s 6s 7s 7s 8s 8s 9s 9s",
        ]) + "\n")
        since = log_size(dir / "broker.log")
        process, log = spawn(dir, "broker", jvm + ["org.apache.rocketmq.broker.BrokerStartup",
                                                   "-c", str(dir / "broker.conf")])
        until_started("rocketmq broker", lambda: "boot success" in log.read_text(errors="replace")[since:], 120,
                      process, log, since)
        return port
    broker_port = on_a_free_port(broker)
    return {"namesrv": f"127.0.0.1:{namesrv_port}", "broker_address": f"127.0.0.1:{broker_port}"}


def until_started(what, check, timeout, process, log, since):
    """wait_until, the process killed when it did not start; a JVM that
    logged "Address already in use" past its log's first `since` characters did not
    (RocketMQ's broker lives on without its port)."""
    def started():
        if "Address already in use" in log.read_text(errors="replace")[since:]:
            raise SystemExit(f"{what} did not start: Address already in use")
        return check()
    try:
        wait_until(what, started, timeout, process, log)
    except SystemExit:
        process.kill()
        process.wait()
        raise


def log_size(path):
    return len(path.read_text(errors="replace")) if path.exists() else 0


def on_a_free_port(start, tries=3):
    """start() again when its JVM exited on "Address already in use": ports
    are checked free seconds before a JVM binds them, and on a loaded
    machine another suite's server or connection can take one meanwhile
    (the broker binds its port, port-2 and port+1)."""
    for attempt in range(1, tries + 1):
        try:
            return start()
        except SystemExit as e:
            if attempt == tries or "Address already in use" not in str(e):
                raise
            print(f"a port was taken before the JVM bound it: starting again ({e.code.splitlines()[0]})",
                  file=sys.stderr)


def rabbitmq_env(dir):
    settings = json.loads((dir / "rabbitmq.json").read_text())
    env = dict(os.environ, HOME=str(dir), RABBITMQ_NODENAME=settings["node"],
               RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT=str(settings["port"]),
               RABBITMQ_DIST_PORT=str(settings["dist_port"]), ERL_EPMD_PORT=str(settings["epmd_port"]),
               ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_MNESIA_BASE=str(dir / "mnesia"),
               RABBITMQ_LOG_BASE=str(dir / "log"), RABBITMQ_CONFIG_FILE=str(dir / "rabbitmq"),
               RABBITMQ_ENABLED_PLUGINS_FILE=str(dir / "enabled_plugins"),
               RABBITMQ_PID_FILE=str(dir / "rabbitmq.pid"))
    return settings, env


def rabbitmq_script(name):
    # Debian's /usr/sbin wrappers switch to the rabbitmq user; the scripts
    # under /usr/lib/rabbitmq/bin run as whoever calls them.
    for path in (Path("/usr/lib/rabbitmq/bin") / name, Path("/usr/sbin") / name):
        if path.exists():
            return str(path)
    raise SystemExit(f"{name} not found: install Debian's rabbitmq-server (make brokers)")


def start_rabbitmq(dir):
    port = free_port()
    settings = {"node": f"idem{port}@localhost", "port": port, "dist_port": free_port(),
                "epmd_port": free_port()}
    (dir / "rabbitmq.json").write_text(json.dumps(settings))
    (dir / "rabbitmq.conf").write_text("\n".join([
        "listeners.tcp.default = " + str(port), "loopback_users = none",
        "log.console = false", "log.file.level = warning", "disk_free_limit.absolute = 50MB",
    ]) + "\n")
    (dir / "enabled_plugins").write_text("[].\n")
    settings, env = rabbitmq_env(dir)
    process, log = spawn(dir, "rabbitmq", [rabbitmq_script("rabbitmq-server")], env=env)
    ctl = [rabbitmq_script("rabbitmqctl"), "-n", settings["node"]]
    wait_until("rabbitmq", lambda: subprocess.run(ctl + ["await_startup", "--timeout", "5"], env=env,
                                                   capture_output=True).returncode == 0,
               120, process, log)
    return {"url": f"amqp://guest:guest@127.0.0.1:{port}/", "port": port, "node": settings["node"]}


def nats_server():
    """target/brokers/nats-server, built from brokers/nats/go.mod once (and
    again when go.mod changes)."""
    binary = CACHE / "nats-server"
    mod = HERE / "nats" / "go.mod"
    if not binary.exists() or binary.stat().st_mtime < mod.stat().st_mtime:
        CACHE.mkdir(parents=True, exist_ok=True)
        go = shutil.which("go") or "/usr/local/go/bin/go"
        subprocess.run([go, "-C", str(HERE / "nats"), "build", "-o", str(binary),
                        "github.com/nats-io/nats-server/v2"], check=True)
    return binary


def start_nats(dir):
    binary = nats_server()
    port = free_port()
    process, log = spawn(dir, "nats", [str(binary), "-a", "127.0.0.1", "-p", str(port), "-js",
                                       "-sd", str(dir / "jetstream")])
    wait_until("nats", lambda: listening(port), 30, process, log)
    return {"url": f"nats://127.0.0.1:{port}"}


STARTERS = {"kafka": start_kafka, "rocketmq": start_rocketmq, "rabbitmq": start_rabbitmq, "nats": start_nats}


def stop(dir):
    """Ends every process started under DIR: TERM to each session, then
    KILL to what is left after 10 s."""
    pids_file = dir / "pids"
    if (dir / "rabbitmq.json").exists():
        settings, env = rabbitmq_env(dir)
        subprocess.run([rabbitmq_script("rabbitmqctl"), "-n", settings["node"], "stop"],
                       env=env, capture_output=True, timeout=60)
        subprocess.run(["epmd", "-port", str(settings["epmd_port"]), "-kill"], capture_output=True)
    if not pids_file.exists():
        return
    pids = [int(p) for p in pids_file.read_text().split()]
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        for pid in pids:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
    pids_file.unlink()


def alive(pid):
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop", "prepare"])
    parser.add_argument("broker", nargs="?", choices=sorted(STARTERS))
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    if args.action == "prepare":
        classpath("kafka")
        classpath("rocketmq")
        nats_server()
        return
    if args.dir is None:
        parser.error("start and stop need --dir")
    dir = args.dir.resolve()
    if args.action == "stop":
        stop(dir)
        return
    if not args.broker:
        parser.error("start needs a broker")
    dir.mkdir(parents=True, exist_ok=True)
    try:
        info = STARTERS[args.broker](dir)
    except BaseException:
        stop(dir)
        raise
    print(json.dumps(dict(info, broker=args.broker, dir=str(dir))), flush=True)


if __name__ == "__main__":
    sys.exit(main())
