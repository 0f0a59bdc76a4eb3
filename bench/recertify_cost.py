"""Re-certification against a fresh census, as issue 27's goal states it: every seat of
the shipped hopper table imported into a fresh database and made stale as a kernel source
change makes it (the stand-in for a Triton upgrade), then re-certified by one census of
trace rows that hold its seats; the same rows get a fresh census in another fresh database
(NBX_TUNE_SEARCH=ranked: no seat's own history or shipped entry, the ranked search and its
audits as usual; the shipped table's other seats vote for a seat with no near seat in the
database, as they do for any user's census). Each side runs in its own process with an empty Triton cache, the
re-certification first (the fresh side then finds the OS's file cache warm: if anything,
that favours the fresh side). The two picks of every seat where they differ are then
timed side by side, three times, and the loss is the median.

    python bench/recertify_cost.py                 a seeded sample of SEATS shipped seats,
                                                   every kernel in it (about 5 minutes)
    python bench/recertify_cost.py --seats all --parallel
                                                   every shipped seat, the two sides at once
                                                   on two GPUs of one host (CUDA devices 0
                                                   and 1, the compile pool's cores halved
                                                   for each): one call's worth where the
                                                   fresh census alone took 526 s
    python bench/recertify_cost.py --seats 30 --seed 1
    python bench/recertify_cost.py --traces A.tsv B.tsv   the seats of these traces
    python bench/recertify_cost.py --smoke         the interpreter, tiny shapes: the table
                                                   is made by a census first
    python bench/recertify_cost.py --control       also a second fresh census of the same
                                                   seats (its own database and cold cache),
                                                   its picks timed against the first's as
                                                   the re-certification's are: the loss two
                                                   fresh censuses read between themselves,
                                                   the floor of the loss measure

Besides the table it prints where each side's time went: per search, the seconds in seats,
of which screening (compiles the worker waited for included), timing, and the rest (making
the seat's inputs and fp64 oracles); outside seats, process start, CUDA initialisation,
planning each seat's search, database writes and shut-down; the kernels each side compiled (Triton cache
entries); how many rounds the re-certified contenders were timed in; and why each fallback
fell back (the certificates' `search_detail`). With --parallel the re-certification runs
beside the fresh census's load on the host, which can only slow it.

If the table was made under other code or Triton than this checkout's, its provenance is
rewritten to this checkout's before the import (the bench stales it next anyway).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nbx_tune.testing.bench import (PICK_REP_MS, breakdown, environment, query, save, side_by_side, stale_everything, table,  # noqa: E402
                     timed_rounds, wall_ms, warm_bytecode)

TRACES = tuple(sorted(str(p) for p in (Path(__file__).resolve().parent.parent / "examples" / "traces")
                     .glob("*_bf16.tsv")))  # every real-scale example: all the shipped seats
SEATS = 48  # the default sample: a fresh census of it and the rest fit one ~5 minute call
SMOKE_TRACE = ("# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"
               + "".join(f"aten.mm\tfloat32,float32\t{m}x16;16x{n}\t\t1\n" for m, n in ((17, 24), (33, 40), (65, 24)))
               + "aten.add.Tensor\tfloat32,float32\t1000;1000\t\t1\n")


def run(cmd, env) -> tuple[float, str]:
    return run_all([(cmd, env)])[0]


def run_all(jobs) -> list[tuple[float, str]]:
    """[(wall seconds, stdout)] of commands started together, each timed to its own exit."""
    # Into files, not pipes: a census's JSON report fills a pipe nobody reads while it runs.
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in jobs]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env, stdout=o, stderr=e, text=True) for (cmd, env), (o, e) in zip(jobs, files)]
    walls: list = [None] * len(procs)
    while None in walls:
        for i, p in enumerate(procs):
            if walls[i] is None and p.poll() is not None:
                walls[i] = time.perf_counter() - t0
        time.sleep(0.05)
    out = []
    for (cmd, _), p, wall, (o, e) in zip(jobs, procs, walls, files):
        o.seek(0), e.seek(0)
        stdout, stderr = o.read(), e.read()
        o.close(), e.close()
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{stderr[-3000:]}")
        out.append((wall, stdout))
    return out


def compiled(cache: Path) -> dict:
    """What a side compiled: Triton cache entries holding a kernel binary, and built launchers."""
    return {"kernels": sum(1 for _ in cache.rglob("*.cubin")) + sum(1 for _ in cache.rglob("*.hsaco")),
            "launchers": sum(1 for _ in cache.rglob("*.so"))}


def current_table(src: Path, dst: Path, profile) -> int:
    """The table with its provenance set to this checkout's code and Triton."""
    import triton

    from nbx_tune.kernels.runtime import table_format, validity
    from nbx_tune.kernels.runtime.registry import all_specs

    doc = table_format.read(src)
    specs = all_specs()
    entries = [e for e in doc["entries"] if e["kernel"] in specs]
    for e in entries:
        spec = specs[e["kernel"]]
        e["provenance"].update(kernel_source_hash=spec.source_hash, config_space_hash=spec.config_space_hash,
                               profile_hash=validity.profile_hash(profile, spec), triton_version=triton.__version__)
    dst.write_text(table_format.dumps(doc["profile"], doc["architecture"], profile.hash, entries))
    return len(entries)


def sample(keys, n: int | None, seed: int) -> list:
    """A seeded sample of n seat keys, every kernel in it, the rest shared out by kernel in
    proportion to its seats (largest remainders); all of them when n is None."""
    keys = sorted(keys)
    if n is None or n >= len(keys):
        return keys
    by_kernel: dict = {}
    for k in keys:
        by_kernel.setdefault(k[0], []).append(k)
    n = max(n, len(by_kernel))
    share = {kn: 1 + (n - len(by_kernel)) * (len(ks) - 1) / max(1, len(keys) - len(by_kernel))
             for kn, ks in by_kernel.items()}
    take = {kn: min(int(x), len(by_kernel[kn])) for kn, x in share.items()}
    for kn in sorted(share, key=lambda kn: share[kn] - int(share[kn]), reverse=True):
        if sum(take.values()) >= n:
            break
        if take[kn] < len(by_kernel[kn]):
            take[kn] += 1
    rng = random.Random(seed)
    return sorted(k for kn, ks in by_kernel.items() for k in rng.sample(ks, take[kn]))


def seat_rows(traces, profile, wanted=None) -> tuple[list, set]:
    """(trace rows, their seat keys): the rows of `traces` whose seat is in `wanted` (all
    when None), each row mapped by the census's own planning."""
    from nbx_tune.tuner.census.census import plan
    from nbx_tune.kernels.trace import Trace, read_trace

    rows, keys = [], set()
    for t in traces:
        for r in read_trace(t).rows:
            seats = plan(Trace(str(t), (r,)), "", profile).seats
            if seats and (wanted is None or set(seats) <= wanted):
                rows.append(r)
                keys.update(seats)
    return rows, keys


def slowest(db: str, n: int = 8) -> list:
    """The n seats that took longest: (label, search, seconds, screening, timing)."""
    rows = query(db, "SELECT s.kernel, s.dtypes, s.flags, s.bucket, t.search, t.total_s, t.screen_s, t.bench_s "
                     "FROM tunings t JOIN seats s ON s.id = t.seat_id WHERE t.kind = 'tune' "
                     "ORDER BY t.total_s DESC")
    return [("|".join(r[:4]), r[4], r[5], r[6], r[7]) for r in rows[:n]]


def fallback_reasons(db: str) -> dict:
    """Why the fallbacks fell back, by the first words of the reason their certificate keeps."""
    out: dict = {}
    for (detail,) in query(db, "SELECT c.search_detail FROM certificates c JOIN tunings t ON t.id = c.tuning_id "
                               "WHERE t.search = 'fallback'"):
        why = (detail or "?").split(": ", 1)[-1]
        for cue in ("timed by", "faster than the old winner", "a config left out", "no old contender", "config space changed",
                    "new since the seed", "none of the old contenders"):
            if cue in why:
                why = cue
                break
        out[why] = out.get(why, 0) + 1
    return out


def by_origin(losses, origin: dict) -> dict:
    """{device the seat's shipped entry was certified on: {seats, median, max}} of `losses`
    ([(seat key, loss, control)])."""
    groups: dict = {}
    for row in losses:
        groups.setdefault(origin.get(row[0], "?"), []).append(row)
    return {dev: {"seats": len(rows), **dict(zip(("median", "max"), summary(rows)))} for dev, rows in groups.items()}


def seat_timings(db: str, key: tuple) -> dict:
    """What one side measured at a seat: its certificate's reason (search_detail) and each
    config's full-timing median (ms), read where the two sides' picks differ."""
    where = "s.kernel = :k AND s.dtypes = :d AND s.flags = :f AND s.bucket = :b AND t.kind = 'tune'"
    args = dict(zip("kdfb", key))
    ms = {c: m for c, m in query(db, "SELECT m.config, m.median_ms FROM measurements m JOIN tunings t "
                                     "ON t.id = m.tuning_id JOIN seats s ON s.id = t.seat_id "
                                     f"WHERE m.final AND {where}", args)}
    why = query(db, "SELECT c.search_detail FROM certificates c JOIN seats s ON s.id = c.seat_id JOIN tunings t "
                    f"ON t.id = c.tuning_id WHERE c.superseded_at IS NULL AND {where}", args)
    return {"why": why[0][0] if why else None, "ms": ms}


CURRENT = ("SELECT s.kernel, s.dtypes, s.flags, s.bucket, c.config, t.search FROM certificates c "
           "JOIN seats s ON s.id = c.seat_id JOIN tunings t ON t.id = c.tuning_id WHERE c.superseded_at IS NULL")


def largest_problems(db: str) -> dict:
    from nbx_tune.kernels.spec import Problem

    out = {}
    for kernel, dtypes, flags, bucket, problem in query(
            db, "SELECT s.kernel, s.dtypes, s.flags, s.bucket, p.problem FROM seat_shapes p "
                "JOIN seats s ON s.id = p.seat_id"):
        p = Problem.from_json(problem)
        k = (kernel, dtypes, flags, bucket)
        if k not in out or p.order() > out[k].order():
            out[k] = p
    return out


def stream_timer(fns: list, rep: float) -> float:
    """A streaming pick's median ms over its operand sets, as the census times it."""
    from nbx_tune.tuner.timing import benchmarkers as timing

    return timing.stream_time(fns, 2, rep, (0.5,))[0]


def pick_losses(fresh: dict, recert: dict, problems: dict, smoke: bool) -> list:
    """[(seat, loss, same)]: the re-certified pick against the fresh census's pick, timed side
    by side at the seat's largest shape as the census times the kernel (over operand sets
    where it is timed as a stream), median of three; `same`: the fresh pick against a
    second copy of itself in the same timings, how far the measure moves one binary."""
    from nbx_tune.kernels.runtime.registry import get_spec
    from nbx_tune.kernels.spec import Config
    from nbx_tune.tuner.certify import screen
    from nbx_tune.tuner.timing import benchmarkers as timing

    device = "cpu" if smoke else "cuda"
    timer = wall_ms if smoke else None
    out = []
    for k in sorted(fresh.keys() & recert.keys()):
        if fresh[k] == recert[k]:
            out.append((k, 0.0, None))
            continue
        spec, p = get_spec(k[0]), problems[k]
        case = screen.make_case(spec, p, device, 1, False)
        outs = screen.alloc_outputs(spec, p, device)
        a, b = Config.parse(fresh[k]), Config.parse(recert[k])
        fns = {"fresh": lambda: spec.launch(a, p, case.inputs, outs),
               "recert": lambda: spec.launch(b, p, case.inputs, outs),
               "again": lambda: spec.launch(a, p, case.inputs, outs)}
        how = timer
        if spec.timing == "stream" and not smoke:  # timed as the census timed it: over operand sets
            sets = [(screen.fresh_inputs(case), screen.alloc_outputs(spec, p, device))
                    for _ in range(timing.n_sets(spec.operand_bytes(p)))]
            fns = {name: [(lambda c=c, i=i, o=o: spec.launch(c, p, i, o)) for i, o in sets]
                   for name, c in (("fresh", a), ("recert", b), ("again", a))}
            how = stream_timer
        losses, same = [], []
        for _ in range(3):
            t = side_by_side(fns, rep_ms=PICK_REP_MS, timer=how)
            losses.append(t["recert"] / t["fresh"] - 1)
            same.append(abs(t["again"] / t["fresh"] - 1))
        out.append((k, statistics.median(losses), statistics.median(same)))
    return out


def summary(losses) -> tuple[float, float]:
    """(median, max) of the losses, NaN where there are none."""
    ls = [x for _, x, _ in losses]
    return (statistics.median(ls), max(ls)) if ls else (float("nan"), float("nan"))


def main(traces, smoke: bool, seats: int | None, seed: int, parallel: bool = False,
         control: bool = False) -> None:
    work = Path(tempfile.mkdtemp(prefix="nbx-rc-"))
    base = {**os.environ}
    if smoke:
        base["TRITON_INTERPRET"] = "1"
    else:
        base.pop("TRITON_INTERPRET", None)
    # This process times the picks: on the interpreter only in a smoke run (set before
    # triton is imported).
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    from nbx_tune.kernels.runtime import table_format
    from nbx_tune.profiles import get_profile
    from nbx_tune.kernels.trace import write_trace

    profile = get_profile("interpreter" if smoke else "hopper")
    trace = work / "seats.tsv"
    cli = [sys.executable, "-m", "nbx_tune.cli.app"]

    def census(path):
        return [*cli, "census", "--model", str(path), "--json"] + (["--no-isolate"] if smoke else [])

    # The table to re-certify: the shipped one, or (smoke) one a census makes here.
    table_src = work / "made.json"
    if smoke:
        (work / "smoke.tsv").write_text(SMOKE_TRACE)
        traces = (str(work / "smoke.tsv"),)
        made = f"sqlite:///{work / 'made.db'}"
        run(census(work / "smoke.tsv"), {**base, "NBX_TUNE_DB": made, "NBX_TUNE_SEARCH": "full"})
        run([*cli, "export", "--profile", profile.name, "-o", str(table_src), "--db", made], base)
    else:
        from nbx_tune.kernels.runtime.certified import TABLE_DIR

        table_src = TABLE_DIR / f"{profile.name}.json"
    entries = current_table(table_src, work / "table.json", profile)
    # Each seat's device of origin: a seed from a sibling device ranks configs as that one did.
    origin = {(e["kernel"], e["dtypes"], e["flags"], e["bucket"]): e["provenance"]["device_name"]
              for e in table_format.read(work / "table.json")["entries"]}
    shipped = set(origin)
    _, held = seat_rows(traces, profile, shipped)
    chosen = set(sample(held, seats, seed))
    rows, keys = seat_rows(traces, profile, chosen)
    write_trace(trace, rows, comments=[f"rows of {len(chosen)} of the table's {entries} seats"])
    kernels = {}
    for k in sorted(keys):
        kernels[k[0]] = kernels.get(k[0], 0) + 1
    print(f"{len(keys)} of the table's {entries} seats ({len(rows)} trace rows): "
          + ", ".join(f"{k} {n}" for k, n in sorted(kernels.items())), flush=True)

    # Re-certification: the whole table imported and made stale; the census tunes the chosen seats.
    recert_db = f"sqlite:///{work / 'recert.db'}"
    run([*cli, "import", str(work / "table.json"), "--db", recert_db], base)
    stale_everything(recert_db)
    fresh_db = f"sqlite:///{work / 'fresh.db'}"
    print(f"bytecode warmed for both sides: {warm_bytecode(base):.1f} s", flush=True)
    def fresh_env(db, cache):  # a fresh census: the ranked search, an empty Triton cache
        return {**base, "NBX_TUNE_DB": db, "NBX_TUNE_SEARCH": "ranked", "TRITON_CACHE_DIR": str(work / cache)}

    sides = [(census(trace), {**base, "NBX_TUNE_DB": recert_db, "NBX_TUNE_SEARCH": "auto",
                              "TRITON_CACHE_DIR": str(work / "cache_recert")}),
             (census(trace), fresh_env(fresh_db, "cache_fresh"))]
    if parallel:  # one GPU and half the host's cores each
        procs = str(max(1, (os.cpu_count() or 2) // 2 - 1))
        for (_, env), gpu in zip(sides, ("0", "1")):
            env.update(CUDA_VISIBLE_DEVICES=gpu, NBX_TUNE_COMPILE_PROCS=procs)
        (recert_s, _), (fresh_s, _) = run_all(sides)
    else:
        recert_s, _ = run(*sides[0])
        # Said at once, in case the fresh census runs past the call's limit.
        print(f"re-certification after a source change: {recert_s:.1f} s (cold Triton cache); in seats "
              + "; ".join(f"{s_} {n} seats {t:.1f} s (screening {sc:.1f}, timing {b_:.1f})"
                          for s_, n, t, sc, b_ in breakdown(recert_db)), flush=True)
        print(table([[label[:70], search, f"{tot:.1f}", f"{scr:.1f}", f"{bch:.1f}"]
                     for label, search, tot, scr, bch in slowest(recert_db)],
                    ["re-certification's slowest seats", "search", "s", "screening s", "timing s"]), flush=True)
        if fallback_reasons(recert_db):
            print(f"fallbacks: {fallback_reasons(recert_db)}", flush=True)
        fresh_s, _ = run(*sides[1])
    print(f"re-certification after a source change: {recert_s:.1f} s, fresh census: {fresh_s:.1f} s "
          f"(cold Triton caches{', side by side on two GPUs' if parallel else ''})", flush=True)
    control_db = f"sqlite:///{work / 'control.db'}"
    if control:  # a second fresh census, alone on the host: how far two of them pick apart
        control_s, _ = run(census(trace), fresh_env(control_db, "cache_control"))
        print(f"second fresh census (the control): {control_s:.1f} s", flush=True)
    built = {"recert": compiled(work / "cache_recert"), "fresh": compiled(work / "cache_fresh")}

    fresh = {r[:4]: r[4] for r in query(fresh_db, CURRENT)}
    # Only the chosen seats: the rest of the imported table stays stale and untouched.
    recert_rows = [r for r in query(recert_db, CURRENT) if r[:4] in fresh]
    recert = {r[:4]: r[4] for r in recert_rows}
    searches = {}
    for r in recert_rows:
        searches[r[5]] = searches.get(r[5], 0) + 1
    fresh_searches = {}
    for (s, n) in query(fresh_db, "SELECT search, count(*) FROM tunings GROUP BY search"):
        fresh_searches[s] = n
    regret = [x for (x,) in query(fresh_db, "SELECT shortcut_loss FROM tunings WHERE search = 'audit' "
                                            "AND shortcut_loss IS NOT NULL")]
    losses = pick_losses(fresh, recert, largest_problems(fresh_db), smoke)
    # Where the picks differ, what each side measured and why the re-certification held.
    seen = {k: {"recert": seat_timings(recert_db, k), "fresh": seat_timings(fresh_db, k)}
            for k, _, _ in losses if fresh[k] != recert[k]}
    per_origin = by_origin(losses, origin)
    med, worst = summary(losses)
    against = None
    if control:
        twin = {r[:4]: r[4] for r in query(control_db, CURRENT)}
        c_losses = pick_losses(fresh, twin, largest_problems(fresh_db), smoke)
        c_med, c_worst = summary(c_losses)
        against = {"fresh2_s": control_s, "loss_median": c_med, "loss_max": c_worst,
                   "loss_by_origin": by_origin(c_losses, origin),
                   "losses": [{"seat": "|".join(k), "fresh": fresh[k], "fresh2": twin[k], "loss": x,
                               "fresh_against_itself": same} for k, x, same in c_losses]}
    spent = {"recert": breakdown(recert_db), "fresh": breakdown(fresh_db)}
    reasons = fallback_reasons(recert_db)
    recert_rounds = timed_rounds(recert_db, "recertified")
    slow = {"recert": slowest(recert_db), "fresh": slowest(fresh_db)}
    env = environment()
    result = {"env": env, "smoke": smoke, "traces": [str(t) for t in traces], "table_entries": entries,
              "sample": {"seats": seats, "seed": seed, "kernels": kernels},
              "seats_fresh": len(fresh), "seats_recert": len(recert), "fresh_s": fresh_s,
              "recert_s": recert_s, "speedup": fresh_s / recert_s, "recert_searches": searches,
              "fresh_searches": fresh_searches, "fresh_audit_losses": regret,
              "loss_median": med, "loss_max": worst, "loss_by_origin": per_origin, "spent": spent,
              "fallback_reasons": reasons,
              "slowest": slow, "parallel": parallel, "compiled": built, "recert_rounds": recert_rounds,
              "control": against,
              "losses": [{"seat": "|".join(k), "fresh": fresh[k], "recert": recert[k], "loss": x,
                          "fresh_against_itself": same, **({"seen": seen[k]} if k in seen else {})}
                         for k, x, same in losses]}
    save("recertify_cost-smoke.json" if smoke else "recertify_cost.json", result)
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table([[len(recert), f"{fresh_s:.1f}", f"{recert_s:.1f}", f"{fresh_s / recert_s:.1f}x",
                  ", ".join(f"{k} {v}" for k, v in sorted(searches.items())),
                  f"{100 * med:.2f} %", f"{100 * worst:.2f} %"]],
                ["seats", "fresh census s", "re-certification s", "faster by", "re-certified as",
                 "median loss", "max loss"]))
    print(table([[side, search, n, f"{tot:.1f}", f"{scr:.1f}", f"{bch:.1f}", f"{tot - scr - bch:.1f}"]
                 for side, rows_ in spent.items() for search, n, tot, scr, bch in rows_]
                + [[side, "(outside seats)", "", f"{wall - sum(r[2] for r in spent[side]):.1f}", "", "", ""]
                   for side, wall in (("recert", recert_s), ("fresh", fresh_s))],
                ["side", "search", "seats", "s in seats", "screening s", "timing s",
                 "inputs and oracles s"]))
    print("kernels compiled (Triton cache entries): " + "; ".join(
        f"{side} {b['kernels']} kernels, {b['launchers']} launchers" for side, b in built.items())
          + "; re-certified contenders timed in " + (", ".join(
              f"{n} round(s): {k} seats" for n, k in sorted(recert_rounds.items())) or "no rounds"))
    print(table([[side, label[:70], search, f"{tot:.1f}", f"{scr:.1f}", f"{bch:.1f}"]
                 for side, rows_ in slow.items() for label, search, tot, scr, bch in rows_],
                ["side", "slowest seats", "search", "s", "screening s", "timing s"]))
    print("pick loss by where the shipped entry was certified: " + "; ".join(
        f"{dev}{' (this GPU)' if dev == env['gpu'] else ''} {o['seats']} seats, median {100 * o['median']:.2f} %, "
        f"max {100 * o['max']:.2f} %" for dev, o in sorted(per_origin.items())))
    if against:
        print(f"the control, a second fresh census ({against['fresh2_s']:.1f} s) against the first: "
              f"{sum(1 for x in against['losses'] if x['fresh'] != x['fresh2'])} seats pick apart, loss median "
              f"{100 * against['loss_median']:.2f} %, max {100 * against['loss_max']:.2f} % (re-certification: "
              f"{100 * med:.2f} %, {100 * worst:.2f} %); seats over 3 %: " + (", ".join(
                  f"{x['seat'][:60]} {100 * x['loss']:+.2f} %" for x in against["losses"] if x["loss"] > 0.03)
                  or "none"))
    if reasons:
        print("fallbacks: " + "; ".join(f"{n} x {why}" for why, n in sorted(reasons.items(), key=lambda x: -x[1])))
    differ = [[("|".join(k))[:60], fresh[k], recert[k], f"{100 * x:+.2f} %", f"{100 * same:.2f} %"]
              for k, x, same in losses if fresh[k] != recert[k]]
    if differ:
        print(table(differ, ["seat (picks differ)", "fresh pick", "re-certified pick", "loss",
                             "fresh pick against itself"]))
    for k, x, _ in losses:
        if fresh[k] != recert[k] and x > 0.01:  # a loss worth reading: why the old ranking held
            r, f = seen[k]["recert"], seen[k]["fresh"]
            print(f"{'|'.join(k)[:90]}: +{100 * x:.2f} %; re-certified because: {r['why']}")
            for side, got in (("re-certification", r["ms"]), ("fresh census", f["ms"])):
                print(f"  {side} timed {len(got)}: " + ", ".join(
                    f"{c} {m:.4f}" + (" *" if c in (fresh[k], recert[k]) else "")
                    for c, m in sorted(got.items(), key=lambda cm: cm[1])[:8]))
    print(f"fresh census: searches {fresh_searches}; audited shortcut losses "
          + (", ".join(f"{100 * x:.2f} %" for x in regret) or "none"))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "-h" in args or "--help" in args:
        print(__doc__)
        sys.exit(0)
    unknown = [a for a in args if a.startswith("-") and a not in {"--smoke", "--traces", "--seats", "--seed", "--parallel",
                                                     "--control"}]
    if unknown:
        sys.exit(f"bench/recertify_cost.py: unknown option {unknown[0]} (--help lists them)")

    def opt(name, default):
        return args[args.index(name) + 1] if name in args else default

    smoke = "--smoke" in args
    traces = TRACES
    if "--traces" in args:
        rest = args[args.index("--traces") + 1:]
        traces = tuple(rest[:next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))])
    n = opt("--seats", "all" if ("--traces" in args or smoke) else str(SEATS))
    main(traces, smoke, None if n == "all" else int(n), int(opt("--seed", "0")), "--parallel" in args,
         "--control" in args)
