"""One writer per output format. A table is a header and rows; a cell is a string (a label) or a tuple
(value, mark[, CI half-width]) that the writer formats: one decimal, "--" for a hole, best bold and second
underlined, "mean ± half-width" where the cell has replicates."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def tex_markdown(text: str) -> str:
    """A Markdown text cell in LaTeX: escaped, `**bold**` as \\textbf, ± as $\\pm$."""
    if text.startswith("**") and text.endswith("**") and len(text) >= 4:
        return f"\\textbf{{{tex_markdown(text[2:-2])}}}"
    return tex_escape(text.replace("**", "")).replace("±", "$\\pm$")


def latex(comment: str | None, header: list, rows: list[list], spec: str, cell=None, text=tex_escape,
          header_text=None, caption: str | None = None, small: bool = False, footnote: str | None = None) -> str:
    """A booktabs tabular with a `% comment` line first (none if None); string cells through `text` (default
    tex_escape), other cells through `cell` (default tex_cell). `header`: one row, or a list of rows, of cells
    passed through `header_text` (default: as they are). With a `caption` the tabular is a `table` float (centred,
    `\\small` if asked, a `footnote` line below the tabular)."""
    cell = cell or (lambda c: tex_cell(*c))
    header_text = header_text or (lambda c: c)
    heads = header if header and isinstance(header[0], list) else [header]
    lines = [f"% {comment}"] if comment is not None else []
    if caption is not None:
        lines += ["\\begin{table}[t]", "\\centering"] + (["\\small"] if small else []) + [f"\\caption{{{caption}}}"]
    lines += [f"\\begin{{tabular}}{{{spec}}}", "\\toprule"]
    lines += [" & ".join(map(header_text, h)) + " \\\\" for h in heads] + ["\\midrule"]
    lines += [" & ".join(text(c) if isinstance(c, str) else cell(c) for c in r) + " \\\\" for r in rows]
    lines += ["\\bottomrule", "\\end{tabular}"]
    if caption is not None:
        lines += ([f"\\par\\footnotesize {footnote}"] if footnote else []) + ["\\end{table}"]
    return "\n".join(lines) + "\n"


def markdown(header: list[str], rows: list[list], rule: str = "---") -> str:
    """A Markdown table; string cells as they are, None a blank cell (`| |`), other cells through md_cell. `rule`:
    each column's cell of the separator row ("---", or " --- " for `| --- |`)."""
    def row(cells):
        return "|" + "|".join(" " if c is None else f" {c if isinstance(c, str) else md_cell(*c)} " for c in cells) + "|"

    lines = [row(header), "|" + f"{rule}|" * len(header)] + [row(r) for r in rows]
    return "\n".join(lines) + "\n"


def comparison(title: str, intro: str, header: list[str] | None, rows: list[list], notes=(),
               closing: str | None = None) -> str:
    """A `_vs_paper.md`: a `# title`, the intro paragraph(s), the table (if a header), the notes as a list and a
    closing paragraph."""
    lines = [f"# {title}", "", intro, ""]
    if header:
        lines.append(markdown(header, rows))
    lines += [f"- {n}" for n in notes] + ([closing] if closing is not None else [])
    return "\n".join(lines) + "\n"


def output_dirs(profile: str, out_root: Path | None = None, figures_root: Path | None = None) -> tuple[Path, Path]:
    """(tables folder, figures folder) of a renderer on `profile`, created: `out_root`/<profile> (default
    paper_tables/out/) and `figures_root`/<profile> (default figures/)."""
    out = (out_root or ROOT / "paper_tables" / "out") / profile
    fig_dir = (figures_root or ROOT / "figures") / profile
    out.mkdir(parents=True, exist_ok=True)
    fig_dir.mkdir(parents=True, exist_ok=True)
    return out, fig_dir
