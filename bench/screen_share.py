"""The share of certification time spent screening, per kernel family, from the tunings
a census recorded (NBX_TUNE_DB).

    python bench/screen_share.py
"""


from sqlalchemy import func, select

from nbx_tune.testing.bench import save, table  # noqa: E402


def main() -> None:
    from nbx_tune.tuner.store import Store
    from nbx_tune.tuner.store.models import Seat, Tuning

    with Store() as store, store.session() as s:
        rows = s.execute(select(Seat.kernel, func.count(Tuning.id), func.sum(Tuning.screen_s),
                                func.sum(Tuning.bench_s), func.sum(Tuning.total_s))
                         .join(Tuning, Tuning.seat_id == Seat.id).where(Tuning.kind == "tune")
                         .group_by(Seat.kernel)).all()
    out = [[k, n, f"{sc:.1f}", f"{b:.1f}", f"{t:.1f}", f"{100 * sc / t:.0f} %"] for k, n, sc, b, t in rows if t]
    save("screen_share.json", out)
    print(table(out, ["kernel", "seats", "screen s", "timing s", "total s", "screen share"]))


if __name__ == "__main__":
    main()
