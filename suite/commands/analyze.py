"""``kvbench analyze values``: value-state statistics of a model on a probe, stored and drawn."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    analyze = commands.add_parser("analyze", help="analyses of what a model caches")
    kinds = analyze.add_subparsers(dest="analysis", required=True)
    values = kinds.add_parser(
        "values", help="Range(v) statistics and their correlation with per-token quantization error"
    )
    values.add_argument("--model", default="smollm2-135m", help="model name or YAML (default: smollm2-135m)")
    values.add_argument("--task", default="fidelity", help="a probe task (default: fidelity)")
    values.add_argument("--limit", type=int, default=2, help="problems (traces) to read (default: 2)")
    values.add_argument("--bits", default="2,4,8", help="quantization widths (default: 2,4,8)")
    values.add_argument("--group", type=int, default=32, help="channels per quantization group (default: 32)")
    values.add_argument("--above", type=float, default=4.0, help="share of tokens above this × the median")
    values.add_argument("--db", type=Path, default=Path("runs"), help="results folder (default: runs)")
    values.add_argument("--out", type=Path, help="also write the figures here (HTML; PNG with kaleido)")
    values.add_argument("--device", default="cpu")
    values.set_defaults(func=values_command)


def values_command(args: argparse.Namespace) -> int:
    import pandas as pd
    from rich.table import Column, Table
    from rich.text import Text

    from kvbench.analysis.collect import collect, write_table
    from kvbench.analysis.figures import FIGURES
    from kvbench.commands.common import console
    from kvbench.errors import SpecError
    from kvbench.store.ingest import ingest

    try:
        bits = tuple(int(b) for b in args.bits.split(","))
    except ValueError:
        raise SpecError(f"--bits {args.bits!r}: give widths separated by commas, e.g. 2,4,8") from None
    if not bits or any(b < 1 or b > 16 for b in bits):
        raise SpecError(f"--bits {args.bits!r}: each width must be between 1 and 16")
    if args.limit < 1 or args.group < 1:
        raise SpecError("--limit and --group must be at least 1")
    analysis = collect(
        args.model,
        args.task,
        limit=args.limit,
        bits=bits,
        group=args.group,
        above=args.above,
        device=args.device,
    )
    path = write_table(analysis, args.db)
    ingest(args.db)
    table = pd.DataFrame([s.__dict__ for s in analysis.stats])
    title = f"{analysis.model} on {analysis.task}: {analysis.problems} traces, {analysis.tokens} tokens"
    columns = ["layer", "max/median Range(v)", f"share > {args.above:g}× median"]
    columns += [f"{kind} {b}-bit" for b in bits for kind in ("Pearson", "Spearman")]
    summary = Table(*(Column(c, justify="right") for c in columns), title=title)
    for layer, rows in table.groupby("layer"):
        heads = rows[rows["head"].notna()]
        layer_wide = rows[rows["head"].isna()]
        whole = dict(zip(layer_wide["statistic"], layer_wide["value"], strict=True))
        per_head = heads.pivot_table(index="head", columns="statistic", values="value")
        ratio = (per_head["range_v_q1"] / per_head["range_v_q0.5"]).max()
        share = per_head[f"range_v_share_above_{args.above:g}x_median"].mean()
        cells = [str(layer), f"{ratio:.1f}", f"{share:.3f}"]
        for b in bits:
            cells += [f"{whole[f'{kind}_range_v_error_{b}bit']:.3f}" for kind in ("pearson", "spearman")]
        summary.add_row(*cells)
    console.print(summary)
    console.print(f"table: {path} (ingested as value_analysis in {args.db / 'kvbench.duckdb'})")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, draw in FIGURES.items():
            figure = draw(table)
            html = args.out / f"{analysis.analysis_id}-{name}.html"
            figure.write_html(html, include_plotlyjs="cdn")
            written = [html.name]
            try:
                figure.write_image(args.out / f"{analysis.analysis_id}-{name}.png")
                written.append(f"{analysis.analysis_id}-{name}.png")
            except (ValueError, ImportError, RuntimeError) as exc:  # plotly draws PNGs through kaleido
                why = type(exc).__name__
                console.print(Text(f"no PNG for {name} ({why}): PNGs need `pip install kaleido`", "yellow"))
            console.print(f"figure: {', '.join(written)}")
    return 0
