"""Drain a prefilled backlog through the sequencer, the sink and the finalizer;
print the drain rate (events/s) and each service's CPU time per event (us).

Run from the repository root with the broker and Postgres up
(`bash deploy/services.sh start`):

    python docs/bench/drain.py 1000          # 1,000 sessions x 49 turns, interleaved

To measure another tree, install it elsewhere and put it first on the path:
`pip install --no-deps --target /tmp/old <tree>; PYTHONPATH=/tmp/old python docs/bench/drain.py 1000`.
Optional: SPY=out.raw [SPY_ON=sink|sequencer] records a py-spy profile of one service.
"""
import os, sys, time, uuid, subprocess
import psycopg
from confluent_kafka import Producer
import turnlog
from turnlog.settings import TurnlogSettings
from turnlog.deploy.topics import create_topics
from turnlog.schemas import encode_event
sys.path.insert(0, ".")  # the repository root: tests.support builds the events
from tests.support import EventFactory
from tests.crash.test_service_crashes import session_events_of

print("turnlog from", turnlog.__file__)
os.makedirs("/tmp/turnlog-drain", exist_ok=True)
N_SESSIONS = int(sys.argv[1]) if len(sys.argv) > 1 else 600
DSN = "postgresql+psycopg://turnlog:turnlog@127.0.0.1:5433/turnlog"
run = uuid.uuid4().hex[:8]
s = TurnlogSettings(bootstrap_servers="127.0.0.1:9092", database_url=DSN, topic_prefix=f"prof-{run}", partitions=6,
                    sequencer_group=f"prof-{run}-seq", sink_group=f"prof-{run}-sink", finalizer_group=f"prof-{run}-fin",
                    faust_data_dir=f"/tmp/turnlog-drain/faust-{run}",
                    insecure_open_fleets=True)  # the backlog is produced unsigned
create_topics(s)
p = Producer({"bootstrap.servers": s.bootstrap_servers, "partitioner": "murmur2_random", "linger.ms": 50})
n = 0
allev = [(f"p-{i}-{run}", session_events_of(EventFactory(f"p-{i}-{run}"), turns=49)) for i in range(N_SESSIONS)]
for step in range(max(len(e) for _, e in allev)):  # interleaved, as live sessions are
    for sid, events in allev:
        if step >= len(events):
            continue
        while True:
            try:
                p.produce(s.topics.events, key=sid.encode(), value=encode_event(events[step])); break
            except BufferError:
                p.poll(0.1)
        n += 1
p.flush(60)
print("produced", n, flush=True)
env = {**os.environ, **s.as_environment(), "TURNLOG_LOG_LEVEL": "WARNING"}
procs = {name: subprocess.Popen([sys.executable, "-m", "turnlog.cli", name], env=env, stdout=subprocess.DEVNULL,
                                stderr=open(f"/tmp/turnlog-drain/{name}-{run}.log", "w")) for name in ("sequencer", "sink", "finalizer")}
if os.environ.get("SPY"):
    spy = subprocess.Popen(["py-spy", "record", "-o", os.environ["SPY"], "-f", "raw", "-r", "200", "-p", str(procs[os.environ.get("SPY_ON", "sink")].pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
conn = psycopg.connect(DSN.replace("+psycopg", ""), autocommit=True)
def stored():
    return int(conn.execute("SELECT coalesce(sum(next_offset),0) FROM sink_offsets WHERE consumer_group=%s", (s.sink_group,)).fetchone()[0])
def finalized():
    return conn.execute("SELECT count(*) FROM sessions WHERE id LIKE %s AND status='finalized'", (f"%-{run}",)).fetchone()[0]
t0 = None
deadline = time.monotonic() + 900
while time.monotonic() < deadline:
    done = stored()
    if done > 0 and t0 is None:
        t0, d0, c0 = time.monotonic(), done, {k: cpu(v.pid) for k, v in procs.items()}
    if done >= n:
        break
    time.sleep(0.1)
t1 = time.monotonic(); c1 = {k: cpu(v.pid) for k, v in procs.items()}
ev = n - d0
print(f"stored {ev} in {t1 - t0:.1f}s: {ev / (t1 - t0):.0f} ev/s", flush=True)
print("CPU us/event:", {k: round((c1[k] - c0[k]) / ev * 1e6) for k in procs}, "total", round(sum(c1[k] - c0[k] for k in procs) / ev * 1e6), flush=True)
while finalized() < N_SESSIONS and time.monotonic() < deadline:
    time.sleep(0.2)
print("finalized", finalized(), "after", round(time.monotonic() - t1, 1), "s more", flush=True)
if os.environ.get("SPY"):
    spy.send_signal(2); spy.wait(30)
for v in procs.values():
    v.send_signal(2)
for v in procs.values():
    v.wait(30)
