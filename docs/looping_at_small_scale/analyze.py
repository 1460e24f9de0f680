"""Tables and figures for docs/looping_at_small_scale/README.md from data/*.jsonl (written by experiments.py).

    python docs/looping_at_small_scale/analyze.py [--data DIR]

Prints Markdown tables (final losses, worth in unique layers) and writes curves.png, worth_vs_tokens.png and
optimizer.png next to this file (with ``--data DIR``, a rerun's folder: into DIR). Worth in layers uses loopscale.fit.ladder (loss linear in log L across the r = 1
ladder of the same width, budget and recipe).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from loopscale.fit.ladder import fit_ladder, phi_from_worth  # noqa: E402

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"  # where the <group>.jsonl files are; the figures are written beside it (--data DIR: into DIR)
FIGS = HERE


def load(group: str) -> list[dict]:
    """Records of one experiment group ([] if it has not run)."""
    p = DATA / f"{group}.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def n_plain(layers: float, d: int) -> float:
    """Unique parameters of a plain model with ``layers`` layers of width d (blocks 12 d^2 + 2 d, 3 d norms)."""
    return layers * (12 * d * d + 2 * d) + 3 * d


def place(recs: list[dict], prefix: str = "") -> list[dict]:
    """Worth in layers and phi_r of every looped record, on the r = 1 ladder of the same records."""
    ladder = [x for x in recs if x["r"] == 1 and x["status"] == "ok"]
    looped = [x for x in recs if x["r"] > 1 and x["status"] == "ok"]
    if len(ladder) < 2:
        return []
    lad = fit_ladder([x["layers_unique"] for x in ladder], [x["final_val_loss"] for x in ladder])
    out = []
    for x in looped:
        w = float(lad.layers_for(x["final_val_loss"]))
        d = x["spec"]["model"]["d_model"]
        out.append(dict(name=x["name"], r=x["r"], layers_unique=x["layers_unique"], loss=x["final_val_loss"],
                        worth=w, phi_r=phi_from_worth(n_plain(w, d), x["N_once"], x["N_rec"], x["r"]),
                        ladder_r2=lad.r2))
    return out


def table_final(recs: list[dict]) -> str:
    """Markdown table of final losses."""
    rows = ["| run | r | unique layers | N_unique | steps | val loss (nats/byte) | tokens/s |", "|---|---|---|---|---|---|---|"]
    for x in recs:
        rows.append(f"| {x['name']} | {x['r']} | {x['layers_unique']} | {x['N_unique']} | {x['steps']} | "
                    f"{x['final_val_loss']:.4f} | {x['tokens_per_s']:.0f} |")
    return "\n".join(rows)


def table_worth(placed: list[dict]) -> str:
    """Markdown table of worth in layers."""
    rows = ["| run | r | unique layers | val loss | worth (layers) | phi_r |", "|---|---|---|---|---|---|"]
    for x in placed:
        rows.append(f"| {x['name']} | {x['r']} | {x['layers_unique']} | {x['loss']:.4f} | {x['worth']:.2f} | "
                    f"{x['phi_r']:.2f} |")
    return "\n".join(rows)


def curves_figures(recs: list[dict]) -> str:
    """curves.png and worth_vs_tokens.png from the 'curves' group; returns a Markdown table of worth by tokens."""
    if not recs:
        return "(curves group not run)"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for x in recs:
        pts = [(c["tokens"], c["val_loss"]) for c in x["curve"] if c.get("val_loss") is not None]
        t, v = zip(*pts, strict=True)
        style = dict(color=str(0.15 + 0.12 * x["layers_unique"] / 2), ls="--") if x["r"] == 1 else dict(lw=2)
        ax.plot(np.array(t) / 1e6, v, label=f"{x['name']} ({x['layers_unique']} unique)", **style)
    ax.set_xlabel("tokens (M)")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_ylim(top=min(2.6, ax.get_ylim()[1]))
    ax.set_title("d = 16, MuonH, linear decay: r = 1 ladder (dashed) and looped models")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGS / "curves.png", dpi=120)
    plt.close(fig)

    # worth in layers at every evaluation point (same step for every model: same data order, same schedule)
    by_name = {x["name"]: {c["step"]: c for c in x["curve"] if c.get("val_loss") is not None} for x in recs}
    steps = sorted(set.intersection(*(set(v) for v in by_name.values())))
    ladder = [x for x in recs if x["r"] == 1]
    looped = [x for x in recs if x["r"] > 1]
    series = {x["name"]: [] for x in looped}
    toks = []
    for s in steps:
        try:
            lad = fit_ladder([x["layers_unique"] for x in ladder], [by_name[x["name"]][s]["val_loss"] for x in ladder])
        except ValueError:
            continue  # the ladder is not yet ordered this early
        toks.append(by_name[ladder[0]["name"]][s]["tokens"])
        for x in looped:
            series[x["name"]].append(float(lad.layers_for(by_name[x["name"]][s]["val_loss"])))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = ["| tokens (M) | " + " | ".join(series) + " |", "|---|" + "---|" * len(series)]
    for i, (name, ys) in enumerate(series.items()):
        L = next(x["layers_unique"] for x in looped if x["name"] == name)
        ax.plot(np.array(toks) / 1e6, ys, color=f"C{i}", lw=2, label=f"{name}: worth (layers)")
        ax.axhline(L, color=f"C{i}", ls=":", lw=1)
    shown = list(range(0, len(toks), max(1, len(toks) // 8)))
    for k in shown + ([len(toks) - 1] if shown[-1] != len(toks) - 1 else []):  # the last point once
        rows.append(f"| {toks[k] / 1e6:.2f} | " + " | ".join(f"{series[n][k]:.2f}" for n in series) + " |")
    ax.set_xlabel("tokens (M)")
    ax.set_ylabel("worth in unique plain layers")
    ax.set_title("looped models on the r = 1 ladder at each step\n(dotted: their own unique layers)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGS / "worth_vs_tokens.png", dpi=120)
    plt.close(fig)
    return "\n".join(rows)


def optimizer_figure(recs: list[dict]) -> None:
    """optimizer.png: final loss against unique layers, plain Muon vs MuonH."""
    if not recs:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, opt in enumerate(("muon", "muonh")):
        sub = [x for x in recs if x["name"].startswith(opt + "_")]
        lad = sorted((x["layers_unique"], x["final_val_loss"]) for x in sub if x["r"] == 1)
        if lad:
            ax.plot(*zip(*lad, strict=True), "o--", color=f"C{i}", label=f"{opt}: r = 1 ladder")
        for x in sub:
            if x["r"] > 1:
                ax.plot(x["layers_unique"], x["final_val_loss"], "s", color=f"C{i}")
                ax.annotate(f"r={x['r']}", (x["layers_unique"], x["final_val_loss"]), fontsize=8,
                            xytext=(4, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("unique layers (log)")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title("d = 16, D = 1M: looped models (squares) at their unique layers")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGS / "optimizer.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    global DATA, FIGS
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=None,
                    help="folder of experiments.py's <group>.jsonl (default: data/ here); the figures go there too")
    a = ap.parse_args(argv)
    if a.data is not None:
        if not sorted(a.data.glob("*.jsonl")):
            ap.error(f"--data {a.data}: no <group>.jsonl files there (experiments.py --data {a.data} writes them)")
        DATA = FIGS = a.data
    opt = load("optimizer")
    print("## optimizer\n")
    print(table_final(opt))
    for o in ("muon", "muonh"):
        print(f"\n### worth, {o}\n")
        print(table_worth(place([x for x in opt if x["name"].startswith(o + "_")])))
    optimizer_figure(opt)
    cur = load("curves")
    print("\n## curves\n")
    if cur:
        print(table_final(cur))
        print("\n### worth by tokens\n")
    print(curves_figures(cur))
    for g in ("injection", "lr"):
        recs = load(g)
        print(f"\n## {g}\n")
        print(table_final(recs) if recs else "(not run)")
    w32 = load("width32")
    print("\n## width32\n")
    if w32:
        print(table_final(w32))
        for tag in ("muonh", "adamw_cos"):
            print(f"\n### worth, {tag}\n")
            print(table_worth(place([x for x in w32 if x["name"].startswith(tag + "_")])))
    seeds = load("seeds") + [x for x in opt if x["name"] in ("muonh_r1_L3", "muonh_r2")]
    print("\n## seeds (d=16, D=1M, MuonH, data order fixed)\n")
    for key in ("muonh_r1_L3", "muonh_r2"):
        v = np.array([x["final_val_loss"] for x in seeds if x["name"] == key or x["name"].startswith(key + "_seed")])
        if v.size >= 2:
            print(f"- {key}: {v.size} seeds, losses {', '.join(f'{x:.4f}' for x in v)}; mean {v.mean():.4f}, "
                  f"SD {v.std(ddof=1):.4f} nats ({100 * v.std(ddof=1) / v.mean():.2f} %)")


if __name__ == "__main__":
    main()
