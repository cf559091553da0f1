"""The tables of the mixers recipe: a family's name, the learning-rate pick, the
control, the summary rows, the markdown and the leaderboard figure."""

from ._shared import display, fmt, report, settings_text

__all__ = ["KERNEL_THEOREMS", "control_failures", "display_row", "family_name",
           "leaderboard_figure", "mixers_markdown", "pick_lr", "proven_here", "summary_row"]

#: the kernel-attention mixers, whose state size is a rank: covered on every family
#: (``"yes"``) or on families in every order of their keys (``"positional"``)
KERNEL_THEOREMS = ("yes", "positional")


def family_name(params):
    """A family's name in the tables, from its make_witness_suite arguments."""
    name = f"{params.get('construction', 'auto')}-m{params['n_bits']}"
    if params.get("n_queries") is not None:
        name += f"-{params['n_queries']}w"
    return name + ("-every-order" if params.get("orders", "fixed") == "all" else "")


def proven_here(theorem, positional):
    """Whether the family's certificate binds a mixer declaring ``theorem``."""
    return theorem == "yes" or (theorem == "positional" and bool(positional))


def pick_lr(fits, default):
    """``(lr, evidence)``: the learning rate solving most fits (ties: the smaller mean
    maximum error, then ``default``, then the smaller rate); the evidence lists each
    rate's solved fits, ``"lr:k/n"``."""
    per_lr = fits.groupby("lr").agg(k=("solved", lambda s: int(s.astype(bool).sum())),
                                    n=("solved", "size"), error=("max_abs_error", "mean"))
    best = min(per_lr.index, key=lambda lr: (-per_lr.loc[lr, "k"], per_lr.loc[lr, "error"],
                                             lr != default, lr))
    return float(best), " ".join(f"{lr:g}:{int(r.k)}/{int(r.n)}" for lr, r in per_lr.iterrows())


def control_failures(control, summary):
    """The families named in ``control`` on which the control mixer solved nothing
    (None without a control, or when the control mixer or none of its families ran)."""
    if not control:
        return None
    rows = summary[(summary["mixer"] == control["mixer"])
                   & summary["family"].isin(control["families"])]
    if not len(rows):
        return None
    return rows.loc[rows["n_solved"] == 0, "family"].tolist()


def summary_row(suite, fam, name, bound, fits):
    """The summary row of one mixer on one family, from its fits."""
    solved = fits["solved"].astype(bool)
    per_state = fits.groupby("state_size")["solved"].agg(["sum", "count"])
    solving = per_state.index[per_state["sum"] > 0]
    smallest = int(solving.min()) if len(solving) else None
    at = fits[fits["state_size"] == smallest] if smallest is not None else fits.iloc[:0]
    theorem = fits["theorem"].iloc[0]
    kernel_like = theorem in KERNEL_THEOREMS
    proven = proven_here(theorem, fits["positional_certificate"].iloc[0])
    # a proven mixer cannot solve below the bound; any other unsolved fit did not train
    cannot = [s for s in per_state.index if proven and s < bound]
    untrained = [(s, r["count"] - r["sum"]) for s, r in per_state.iterrows()
                 if s not in cannot and r["sum"] < r["count"]]
    return dict(
        family=fam,
        n_bits=int(suite.X.shape[2]),
        seq_len=int(suite.X.shape[1]),
        n_sequences=int(suite.X.shape[0]),
        mixer=name,
        theorem=theorem,
        proven=proven,
        certified_min_rank=bound,
        smallest_solving_state=smallest,
        smallest_solving_state_floats=(int(at["state_floats"].iloc[0])
                                       if len(at) and at["state_floats"].notna().all()
                                       else None),
        smallest_solving_rank=smallest if kernel_like else None,
        solved_fraction=float(at["solved"].astype(bool).mean()) if len(at) else 0.0,
        solved_below_bound=bool(smallest is not None and smallest < bound),
        solved_by_state=" ".join(f"{s}:{int(r['sum'])}/{int(r['count'])}"
                                 for s, r in per_state.iterrows()),
        cannot=" ".join(str(s) for s in cannot),
        did_not_train=" ".join(f"{s}:{int(k)}/{int(per_state.loc[s, 'count'])}"
                               for s, k in untrained),
        n_solved=int(solved.sum()),
        n_fits=int(len(fits)),
        fit_time=float(fits["fit_time"].mean()),
    )


def display_row(r):
    """A summary row as ``table.csv`` shows it."""
    return {
        "family": r["family"],
        "mixer": r["mixer"],
        "theorem": r["theorem"],
        "bound proven here": "yes" if r["proven"] else "no",
        "certified rank": fmt(r["certified_min_rank"]),
        "smallest solving state": fmt(r["smallest_solving_state"]),
        "state floats there": fmt(r["smallest_solving_state_floats"]),
        "solved there": fmt(r["solved_fraction"]),
        "below the bound": "yes" if r["solved_below_bound"] else "no",
        "solved per state (k/n)": r["solved_by_state"],
        "cannot: below the proven bound": r["cannot"] or "-",
        "did not train (unsolved/n)": r["did_not_train"] or "-",
        "lr": f"{r['lr']:g}",
        "lr sweep (solved per lr)": r["lr_sweep"],
        "fit time (s)": fmt(r["fit_time"]),
    }


def mixers_markdown(cfg, families, summary, checks, agree, failed):
    """The recipe's ``summary.md``; ``failed``: the families the control failed."""
    fams = ", ".join(
        f"`{r.family}` ({r.n_sequences} sequences of length {r.seq_len}, certified rank "
        f"{r.certified_min_rank})"
        for r in summary.drop_duplicates("family").itertuples())
    own = "".join(f"; `{family_name(params)}`: " + settings_text(
        {k: v for k, v in fcfg["mixer"].items() if cfg["mixer"].get(k) != v})
        for params, fcfg in families if fcfg["mixer"] != cfg["mixer"])
    sweep = cfg["lr_sweep"]
    lr_text = ("*lr*: the learning rate of every fit of the mixer" if not sweep else
               f"*lr*: the mixer's learning rate, the one of {list(sweep['lrs'])} that "
               f"solved most fits of `{family_name(sweep['family'])}` at "
               f"{list(sweep['state_factors'])} times its certified rank, seeds "
               f"{list(sweep['seeds'])} (ties: the smaller mean maximum error); "
               "*lr sweep* gives each rate's solved fits (`lr_sweep.csv`)")
    invalid = ("" if not failed else
               f"**INVALID: the control `{cfg['control']['mixer']}` solved nothing on "
               + ", ".join(f"`{f}`" for f in failed) + ", where it solved before; a "
               "failed fit here says nothing about a mixer.** ")
    return report(
        "Sequence mixers on final-query Min-IP: state needed against the certified rank",
        invalid + f"Families in final-query form (the query token last): {fams}. Fits: "
        + settings_text({k: v for k, v in cfg["mixer"].items() if not (sweep and k == "lr")})
        + own + f"; seeds {list(cfg['seeds'])} (unless a family "
        "sets its own: the column *solved per state* counts them). " + lr_text + ". "
        "*Cannot*: states below the certified rank of a mixer the proof covers there; "
        "*did not train*: the other states where some seed did not solve (a failed fit "
        "is not evidence about a mixer). *Theorem*: "
        "'yes' when the lower bound is proven for the mixer (a normalised nonnegative "
        "kernel head; its state size is its rank), 'positional' when it is proven for "
        "families that hold every order of their keys (`-every-order`: position-"
        "dependent maps), 'no' outside it. *Smallest solving state*: the "
        "smallest state size of the grid at which some seed solves every sequence "
        "('-': none); *state floats*: what that state carries from one token to the "
        "next. Largest |parallel - recurrent| output over the fits checked: "
        f"{max(agree.values()):.2g}.",
        display(summary, display_row), checks, note=_below_note(summary),
        labels={"no_proven_mixer_solved_below_bound":
                "no mixer the proof covers solved below the certified rank",
                "recurrent_equals_parallel":
                "every mixer's recurrent form gives its parallel outputs (within 1e-6)",
                "control_solved":
                f"the control ({(cfg['control'] or {}).get('mixer')}) solved every family "
                "it solved before"})


def _below_note(summary):
    """What solved below the certified rank, by theorem row (None if nothing did)."""
    rows = summary[summary["solved_below_bound"]]
    if not len(rows):
        return None
    found = "; ".join(f"`{r.mixer}` on `{r.family}` at state {fmt(r.smallest_solving_state)} "
                      f"(certified rank {r.certified_min_rank}, theorem: {r.theorem})"
                      for r in rows.itertuples())
    note = f"Solved below the certified rank: {found}."
    if (rows["theorem"] == "positional").any():
        note += (" A fixed-order family's certificate bounds positionless maps; a "
                 "position-dependent map that solves below it uses the order (the "
                 "smaller key of every three-distinct-token sequence at one fixed "
                 "position), which the same family in every order of its keys "
                 "(`-every-order`, a positional certificate) takes away.")
    return note


def leaderboard_figure(results, summary):
    """Solved fraction against state size, a panel a family."""
    import matplotlib.pyplot as plt

    fams = list(dict.fromkeys(summary["family"]))
    ncols = min(3, len(fams))
    nrows = -(-len(fams) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols + 2.2, 4.0 * nrows + 0.6),
                             layout="constrained", squeeze=False)
    axes = axes.ravel()
    for ax in axes[len(fams):]:
        ax.set_axis_off()
    markers = "osD^vP*Xh"
    for ax, fam in zip(axes, fams):
        part = results[results["family"] == fam]
        bound = int(summary.loc[summary["family"] == fam, "certified_min_rank"].iloc[0])
        groups = list(part.groupby("mixer", sort=True))
        for i, (name, g) in enumerate(groups):
            frac = g.groupby("state_size")["solved"].apply(lambda s: s.astype(bool).mean())
            theorem = g["theorem"].iloc[0]
            # a small horizontal offset per mixer keeps coinciding points visible
            shift = 2.0 ** (0.04 * (i - (len(groups) - 1) / 2))
            ax.plot(frac.index * shift, frac.to_numpy(), marker=markers[i % len(markers)],
                    color=f"C{i}", linestyle="-" if theorem in KERNEL_THEOREMS else "--",
                    label=f"{name} ({theorem})")
        ax.axvline(bound, color="k", linestyle=":", label="certified rank")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("state size (rank / key dimension)")
        ax.set_ylabel("solved fraction over seeds")
        ax.set_title(f"{fam} (certified rank {bound})")
    axes[ncols - 1].legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("Final-query Min-IP: solved fraction against state size\n"
                 "(solid: kernel attention, covered on every family or in every order; "
                 "dashed: others)")
    return fig
