"""The job's TCP store under many ranks: rendezvous and heartbeats as gpucert's runtime does them, measured.

Every rank of a gpucert job meets in one torch.distributed TCPStore (runtime/group.py) and its nodes heartbeat
into it (runtime/watchdog.py). This starts that store's server in a process of its own on 127.0.0.1 and N
lightweight ranks (threads spread over a few client processes), 8 a node, each speaking the real TCPStore
protocol over its own two connections, doing what a rank does:

- rendezvous (group._meet): append its identity (a RankIdentity's JSON, about 250 bytes) to `identities`, add
  `joined` (the rank that completes it sets `all_joined`); rank 0 waits for `all_joined` (a store wait), reads
  the identities once, sets every node's counter and publishes `roster` (identity.pack_roster); every other rank
  waits for `roster` and reads it;
- heartbeats (watchdog.Watchdog): each node's keeper (its local rank 0; the keeper also publishes `plan/<node>`,
  which its node's other ranks wait for and read) every interval on its second connection: add
  `hb/node/<node>`, check `abort`, multi_get the watched counters (rank 0: every other node's; any other
  keeper: node 0's); every other rank blocks in a wait for `wake/<rank>` (its keeper watches it by pid: /proc
  reads, no store traffic, not simulated), which a keeper sets for its node when it reads the abort;
- the last node's keeper stops beating after a few rounds, as a SIGSTOPped keeper or a lost node does; rank 0
  names it after heartbeat_timeout_s of an unchanged counter (watchdog._silent_peer), sets `abort` and wakes the
  named keeper's node; the other keepers read it at their next beat and wake their nodes.

It reports per N: the rendezvous time (slowest rank), the latency of a heartbeat round trip (median, p99, max),
of rank 0's multi_get, the time from the victim's last beat to rank 0 naming it and to every rank having read
the abort, and the store server's CPU (its process's utime + stime over the heartbeat window and the
rendezvous). Everything runs on 127.0.0.1 and is bounded: N <= 2,048 ranks and every phase has a deadline.

Usage:
    python tools/store_scale.py --ranks 256 512 1024 [--interval 2] [--timeout 30] [--json OUT.json]

Read the table as: tail_s (the last rank joins -> every rank holds the roster), srv_cpu_tail_s (the server's
CPU over that tail), beat p50/p99/max in ms (a keeper's add + check + multi_get), rank-0 multi_get of every
node's counter in ms, wait_cpu_% (the server's CPU while every rank but a straggler waits), srv_cpu_% (while
heartbeating), named_s (victim's last beat -> rank 0 names it; the floor is timeout + one interval), all_out_s
(-> the last rank read the abort). Results: docs/results/store-scale.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

HOST = "127.0.0.1"
MAX_RANKS = 2048
PER_NODE = 8  # GPUs a node: one keeper, seven waiting ranks
IDENTITY = {
    "rank": 0,
    "world_size": 0,
    "local_rank": 0,
    "local_world_size": PER_NODE,
    "node_rank": 0,
    "num_nodes": 0,
    "node": "gpu-node-0000",
    "host": "gpu-node-0000",
    "device": "cuda:0",
    "gpu_uuid": "GPU-30637d0c-0c65-5ac2-fdcb-cc5b3871a0d4",
    "gpu_index": 0,
    "pid": 123456,
}


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(port_q: Any, stop: Any) -> None:
    import torch.distributed as dist

    # As group.connect_store serves it (libuv is torch's default server since 2.4).
    store = dist.TCPStore(HOST, 0, None, True, timedelta(seconds=300), wait_for_workers=False, multi_tenant=False)
    port_q.put(store.port)
    stop.wait()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Rank:
    def __init__(self, rank: int, n: int, port: int, cfg: dict[str, Any], out: dict[str, Any]) -> None:
        self.rank, self.n, self.port, self.cfg, self.out = rank, n, port, cfg, out

    def run(self) -> None:
        import torch.distributed as dist

        from gpucert.runtime.identity import RankIdentity, pack_roster, unpack_roster

        cfg, r, n = self.cfg, self.rank, self.n
        node, local = divmod(r, PER_NODE)
        nodes = -(-n // PER_NODE)
        keeper = local == 0
        timeout = timedelta(seconds=cfg["rendezvous_timeout_s"])
        # Two connections, as a rank has: the main thread's (rendezvous) and the watchdog's (heartbeats).
        c0 = time.perf_counter()
        main = dist.TCPStore(HOST, self.port, None, False, timeout, wait_for_workers=False)
        beat = dist.TCPStore(HOST, self.port, None, False, timeout, wait_for_workers=False)
        self.out["connect_s"] = time.perf_counter() - c0
        if r == n - 1:
            time.sleep(cfg["straggle_s"])  # the last rank comes late: every other rank waits meanwhile
        t0 = time.time()
        ident = dict(IDENTITY, rank=r, world_size=n, local_rank=local, node_rank=node, num_nodes=nodes, pid=r)
        ident.update(node=f"gpu-node-{node:04d}", host=f"gpu-node-{node:04d}", device=f"cuda:{local}")
        ident.update(gpu_uuid=f"GPU-{node:08x}-0c65-5ac2-fdcb-cc5b3871a0{local:02x}", gpu_index=local)
        main.append("identities", json.dumps(ident, separators=(",", ":")) + "\n")
        self.out["joined_at"] = time.time()
        if main.add("joined", 1) == n:
            main.set("all_joined", "1")
        if r == 0:
            main.wait(["all_joined"], timeout)
            g0 = time.perf_counter()
            lines = main.get("identities").decode().splitlines()
            peers = sorted((RankIdentity.from_dict(json.loads(line)) for line in lines), key=lambda p: p.rank)
            main.multi_set([f"hb/node/{k}" for k in range(nodes)], ["0"] * nodes)
            if len(peers) != n:
                self.out["error"] = f"rank 0: {len(peers)} identities for {n} ranks"
                return
            roster = json.dumps(pack_roster(peers), separators=(",", ":"))
            main.set("roster", roster)
            self.out["roster_bytes"] = len(roster)
            self.out["pack_s"] = time.perf_counter() - g0
            p0 = time.perf_counter()
            unpack_roster(json.loads(roster))
            self.out["unpack_s"] = time.perf_counter() - p0  # what every other rank does in its own process
        else:
            main.wait(["roster"], timeout)
            g0 = time.perf_counter()
            raw = main.get("roster")
            self.out["roster_get_s"] = time.perf_counter() - g0
            # Not parsed here: 1,024 ranks' parsing on two cores and eight GILs would be measured, not the store's
            # work; a rank parses in its own process (measure() times one parse).
            if len(raw) < 50 * n:
                self.out["error"] = f"rank {r}: a roster of {len(raw)} bytes for {n} ranks"
                return
        self.out["rendezvous_s"] = time.time() - t0
        self.out["met_at"] = time.time()
        main.add("met", 1)
        # The watchdog: a keeper publishes its node's plan, its other ranks read it.
        if keeper:
            beat.set(f"plan/{node}", "[]")
        else:
            beat.wait([f"plan/{node}"], timeout)
            beat.get(f"plan/{node}")
            self._wait_for_abort(beat)
            return
        self._keep(beat, node, nodes)

    def _wait_for_abort(self, beat: Any) -> None:
        import torch.distributed as dist

        try:
            beat.wait([f"wake/{self.rank}"], timedelta(seconds=self.cfg["run_s"]))
        except dist.DistStoreError:
            return  # nobody was named within the run: its error says so
        self.out["saw_abort_at"] = time.time()

    def _wake(self, beat: Any, node: int) -> None:
        others = [r for r in range(node * PER_NODE + 1, min((node + 1) * PER_NODE, self.n))]
        if others:
            beat.multi_set([f"wake/{r}" for r in others], ["abort"] * len(others))

    def _keep(self, beat: Any, node: int, nodes: int) -> None:
        """A keeper's loop: beat for the node, read the abort record, look at the watched counters."""
        cfg, r = self.cfg, self.rank
        interval, victim = cfg["interval_s"], (nodes - 1) * PER_NODE  # the last node's keeper
        keys = [f"hb/node/{k}" for k in range(1, nodes)] if r == 0 else ["hb/node/0"]
        last: dict[int, tuple[bytes, float]] = {}
        beats: list[float] = []
        beat_at: list[float] = []
        gets: list[float] = []
        end = time.monotonic() + cfg["run_s"]
        while time.monotonic() < end:
            time.sleep(interval)
            if r == victim and len(beats) >= cfg["victim_beats"]:
                if "stopped_at" not in self.out:
                    self.out["stopped_at"] = time.time()
                continue  # stopped: no beat, no read (SIGSTOP)
            start = time.perf_counter()
            beat.add(f"hb/node/{node}", 1)
            aborted = beat.check(["abort"])
            g0 = time.perf_counter()
            values = beat.multi_get(keys) if keys else []
            done = time.perf_counter()
            beats.append(done - start)
            beat_at.append(time.time())
            if r == 0:
                gets.append(done - g0)
            if aborted:
                self.out["saw_abort_at"] = time.time()
                self._wake(beat, node)  # as leave_failed has a keeper do: its node's waiting ranks read it
                break
            if r == 0:
                now = time.monotonic()
                for k, value in enumerate(values, start=1):
                    seen = last.get(k)
                    if seen is None or seen[0] != value:
                        last[k] = (value, now)
                    elif now - seen[1] > cfg["timeout_s"] and "named_at" not in self.out:
                        self.out["named_at"] = time.time()
                        self.out["named"] = k * PER_NODE
                        beat.compare_set("abort", "", json.dumps({"rank": k * PER_NODE, "cause": "no heartbeat"}))
                        self._wake(beat, k)  # the named keeper's node has nobody else to wake it
        self.out["beats_s"] = beats
        self.out["beat_at"] = beat_at
        self.out["multi_get_s"] = gets


def _client(ranks: list[int], n: int, port: int, cfg: dict[str, Any], q: Any) -> None:
    outs = [{} for _ in ranks]  # type: list[dict[str, Any]]
    threads = [
        threading.Thread(target=_guarded, args=(Rank(r, n, port, cfg, out),), daemon=True)
        for r, out in zip(ranks, outs, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(cfg["rendezvous_timeout_s"] + cfg["run_s"] + 30)
    q.put({"ranks": ranks, "outs": outs, "cpu_s": time.process_time()})


def _guarded(rank: Rank) -> None:
    try:
        rank.run()
    except Exception as exc:  # one rank's error is reported, the others go on
        rank.out["error"] = f"rank {rank.rank}: {type(exc).__name__}: {str(exc).splitlines()[0]}"


def measure(n: int, cfg: dict[str, Any], procs: int) -> dict[str, Any]:
    import torch.distributed as dist  # before the fork, so the children do not each import torch again

    # fork: eight processes importing torch took two minutes on a busy 2-core machine; nothing in this
    # process holds a store or a thread when they fork.
    ctx = mp.get_context("fork")
    port_q, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(port_q, stop), daemon=True)
    server.start()
    port = port_q.get(timeout=60)
    cpu0, wall0 = _cpu_s(server.pid), time.time()
    q = ctx.Queue()
    clients = [
        ctx.Process(target=_client, args=(list(range(i, n, procs)), n, port, cfg, q), daemon=True)
        for i in range(min(procs, n))
    ]
    for c in clients:
        c.start()
    # The server's CPU while ranks wait for the straggler, from its arrival until every rank holds the roster
    # (`met`), then over a window of steady heartbeats. This probe's own requests (20 a second) are in it.
    probe = dist.TCPStore(HOST, port, None, False, timedelta(seconds=60), wait_for_workers=False)
    deadline = time.time() + 600
    # Waiting: every rank but the straggler has joined and waits (a store wait) until it comes.
    while probe.add("joined", 0) < n - 1 and time.time() < deadline:
        time.sleep(0.05)
    cpu_poll, wall_poll = _cpu_s(server.pid), time.time()
    while probe.add("joined", 0) < n and time.time() < deadline:
        time.sleep(0.05)
    cpu_joined, wall_joined = _cpu_s(server.pid), time.time()
    while probe.add("met", 0) < n and time.time() < deadline:
        time.sleep(0.02)
    cpu1, wall1 = _cpu_s(server.pid), time.time()
    # Heartbeats: from half an interval after the rendezvous to half an interval before the victim stops.
    time.sleep(cfg["interval_s"] / 2)
    cpu_hb, wall_hb = _cpu_s(server.pid), time.time()
    time.sleep(cfg["interval_s"] * (cfg["victim_beats"] - 1))
    cpu2, wall2 = _cpu_s(server.pid), time.time()
    results = [q.get(timeout=cfg["rendezvous_timeout_s"] + cfg["run_s"] + 60) for _ in clients]
    for c in clients:
        c.join(10)
    stop.set()
    server.join(10)
    outs = [o for res in results for o in res["outs"]]
    errors = [o["error"] for o in outs if "error" in o]
    beats = [b for o in outs for b in o.get("beats_s", [])]
    # Steady: beats after every rank has met; before, early ranks beat while late ones fetch identities.
    all_met = max((o["met_at"] for o in outs if "met_at" in o), default=0.0)
    steady = [b for o in outs for b, at in zip(o.get("beats_s", []), o.get("beat_at", []), strict=True) if at > all_met]
    gets = [g for o in outs for g in o.get("multi_get_s", [])]
    rank0 = next(o for res in results for r, o in zip(res["ranks"], res["outs"], strict=True) if r == 0)
    victim_rank = (-(-n // PER_NODE) - 1) * PER_NODE
    victim = next(o for res in results for r, o in zip(res["ranks"], res["outs"], strict=True) if r == victim_rank)
    # The victim's last beat ended about one interval before it noticed it should stop.
    last_beat = victim.get("stopped_at", float("nan")) - cfg["interval_s"]
    saw = [o["saw_abort_at"] for o in outs if "saw_abort_at" in o]
    return {
        "ranks": n,
        "client_processes": len(clients),
        "connections": 2 * n,
        "errors": errors[:5],
        "error_count": len(errors),
        # From the last rank's arrival to every rank holding every identity: the store's share of a rendezvous
        # (the rest is the ranks' own start-up, here the client processes importing torch).
        "rendezvous_tail_s": round(
            max((o["met_at"] for o in outs if "met_at" in o), default=float("nan"))
            - max((o["joined_at"] for o in outs if "joined_at" in o), default=float("nan")),
            3,
        ),
        "connect_s_p50": _pct([o["connect_s"] for o in outs if "connect_s" in o], 0.5),
        "connect_s_max": max((o["connect_s"] for o in outs if "connect_s" in o), default=float("nan")),
        "roster_bytes": rank0.get("roster_bytes"),
        "roster_get_ms_p50": 1e3 * _pct([o["roster_get_s"] for o in outs if "roster_get_s" in o], 0.5),
        "roster_get_ms_max": 1e3 * max((o["roster_get_s"] for o in outs if "roster_get_s" in o), default=0.0),
        "rank0_pack_ms": round(1e3 * rank0.get("pack_s", float("nan")), 1),
        "unpack_ms": round(1e3 * rank0.get("unpack_s", float("nan")), 1),
        "rendezvous_server_cpu_s": round(cpu1 - cpu0, 3),
        "rendezvous_tail_server_cpu_s": round(cpu1 - cpu_joined, 3),
        "rendezvous_wall_s": round(wall1 - wall0, 3),
        "rendezvous_tail_wall_s": round(wall1 - wall_joined, 3),
        "waiting_server_cpu_pct": round(100 * (cpu_joined - cpu_poll) / max(wall_joined - wall_poll, 1e-9), 2),
        "waiting_wall_s": round(wall_joined - wall_poll, 2),
        "beat_ms_p50": 1e3 * _pct(beats, 0.5),
        "beat_ms_p99": 1e3 * _pct(beats, 0.99),
        "beat_ms_max": 1e3 * max(beats, default=float("nan")),
        "beats": len(beats),
        "steady_beat_ms_p50": 1e3 * _pct(steady, 0.5),
        "steady_beat_ms_p99": 1e3 * _pct(steady, 0.99),
        "steady_beat_ms_max": 1e3 * max(steady, default=float("nan")),
        "steady_beats": len(steady),
        "rank0_multi_get_ms_p50": 1e3 * _pct(gets, 0.5),
        "rank0_multi_get_ms_max": 1e3 * max(gets, default=float("nan")),
        "server_cpu_pct_heartbeats": round(100 * (cpu2 - cpu_hb) / (wall2 - wall_hb), 2),
        "heartbeat_window_s": round(wall2 - wall_hb, 2),
        "named": rank0.get("named"),
        "named_s": round(rank0.get("named_at", float("nan")) - last_beat, 2),
        "all_out_s": round(max(saw, default=float("nan")) - last_beat, 2),
        "ranks_that_saw_abort": len(saw),
        "client_cpu_s": round(sum(res["cpu_s"] for res in results), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--interval", type=float, default=2.0, help="runtime.heartbeat_interval_s")
    parser.add_argument("--timeout", type=float, default=30.0, help="runtime.heartbeat_timeout_s")
    parser.add_argument("--victim-beats", type=int, default=5, help="beats before the last rank stops")
    parser.add_argument("--procs", type=int, default=8, help="client processes the ranks' threads share")
    parser.add_argument("--straggle", type=float, default=10.0, help="seconds the last rank joins late")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    if max(args.ranks) > MAX_RANKS:
        parser.error(f"at most {MAX_RANKS} ranks on one machine")
    cfg = {
        "interval_s": args.interval,
        "timeout_s": args.timeout,
        "victim_beats": args.victim_beats,
        "straggle_s": args.straggle,
        "rendezvous_timeout_s": 120.0,
        # Long enough for the victim's beats, the timeout, naming and one more beat for everyone to read it.
        "run_s": args.interval * (args.victim_beats + 10) + args.timeout,
    }
    rows = []
    for n in args.ranks:
        row = measure(n, cfg, args.procs)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        f"{'ranks':>6} {'tail_s':>7} {'srv_cpu_tail_s':>14} {'beat_p50':>9} {'beat_p99':>9} {'beat_max':>9} "
        f"{'steady_p99':>10} "
        f"{'r0_get_ms':>9} {'wait_cpu_%':>10} {'srv_cpu_%':>9} {'named_s':>8} {'all_out_s':>9} errors"
    )
    for r in rows:
        print(
            f"{r['ranks']:>6} {r['rendezvous_tail_s']:>7.2f} {r['rendezvous_tail_server_cpu_s']:>14.2f} "
            f"{r['beat_ms_p50']:>9.2f} {r['beat_ms_p99']:>9.2f} {r['beat_ms_max']:>9.1f} "
            f"{r['steady_beat_ms_p99']:>10.2f} "
            f"{r['rank0_multi_get_ms_p50']:>9.2f} {r['waiting_server_cpu_pct']:>10.1f} "
            f"{r['server_cpu_pct_heartbeats']:>9.1f} {r['named_s']:>8.1f} "
            f"{r['all_out_s']:>9.1f} {r['error_count']}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": cfg, "machine": os.uname().nodename, "cpus": os.cpu_count(), "rows": rows}, fh)
    return 0 if all(r["error_count"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
