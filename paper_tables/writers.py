"""One writer per output format. A table is a header and rows; a cell is a string (a label) or a tuple
(value, mark[, CI half-width]) that the writer formats: one decimal, "--" for a hole, best bold and second
underlined, "mean ± half-width" where the cell has replicates."""

from __future__ import annotations


def fmt(v) -> str:
    if v is None:
        return "--"
    return f"{v:.1f}" if abs(v) < 1e5 else f"{v:.3g}"


def fmt_ci(v, half_width, template: str = "{mean} ± {hw}") -> str:
    """The mean, with the half-width of its 95% CI when the cell has two or more replicates."""
    return fmt(v) if v is None or half_width is None else template.format(mean=fmt(v), hw=fmt(half_width))


def tex_cell(v, mark, half_width=None) -> str:
    s = fmt_ci(v, half_width, "{mean}{{\\scriptsize$\\pm${hw}}}")
    return f"\\textbf{{{s}}}" if mark == "best" else f"\\underline{{{s}}}" if mark == "second" else s


def md_cell(v, mark, half_width=None) -> str:
    s = fmt_ci(v, half_width)
    return f"**{s}**" if mark == "best" else f"<u>{s}</u>" if mark == "second" else s


def tex_escape(text: str) -> str:
    # '%' would start a LaTeX comment and swallow the rest of the row
    return text.replace("_", "\\_").replace("%", "\\%")


def latex(comment: str, header: list[str], rows: list[list], spec: str, cell=None) -> str:
    """A booktabs tabular with a `% comment` line first; string cells escaped, other cells through `cell`
    (default tex_cell)."""
    cell = cell or (lambda c: tex_cell(*c))
    lines = [f"% {comment}", f"\\begin{{tabular}}{{{spec}}}", "\\toprule", " & ".join(header) + " \\\\", "\\midrule"]
    lines += [" & ".join(tex_escape(c) if isinstance(c, str) else cell(c) for c in r) + " \\\\" for r in rows]
    return "\n".join(lines + ["\\bottomrule", "\\end{tabular}"]) + "\n"


def markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c if isinstance(c, str) else md_cell(*c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
