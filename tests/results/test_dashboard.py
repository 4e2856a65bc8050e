"""The static dashboard: built from result files only, offline, one file; foreign files listed, not fatal."""

import json

from state_reduction.dashboard import build_dashboard
from state_reduction.results import build_result, write_result


def put(root, experiment, name, kind, config, metrics):
    write_result(root / "tiny" / experiment / f"{name}.json",
                 build_result(kind, profile="tiny", experiment=experiment, config=config, metrics=metrics,
                              wall_time_s=1.5))


def test_dashboard_shows_every_run_a_plot_and_the_skipped_files(tmp_path):
    for ratio, ppl in ((0.5, 120.0), (0.75, 150.0)):
        put(tmp_path, "deltanet_gdn", f"dn-l1-r{int(ratio * 100)}-eval-pre", "evaluate",
            {"stage": "eval-pre", "model": "deltanet", "method": "l1", "ratio": ratio, "rft": False},
            {"wiki_word_perplexity": ppl, "zero_shot_avg": float("nan")})
    put(tmp_path, "speed", "decode", "bench", {"mode": "decode", "model": "gdn"}, {"speedup_50": 1.4})
    (tmp_path / "tiny" / "speed" / "old.json").write_text(json.dumps({"schema_version": 0}))
    out = build_dashboard("tiny", tmp_path)
    text = out.read_text()
    assert out == tmp_path / "tiny" / "dashboard.html"
    assert "<h2 id='deltanet_gdn'>deltanet_gdn (2 runs)</h2>" in text and "speed (1 runs)" in text
    assert "<td>120</td>" in text and "<td>150</td>" in text
    assert text.count("data:image/png;base64,") == 1  # a plot for the experiment with evaluations only
    assert "old.json" in text and "Files skipped" in text
    cells = [c.split("<", 1)[0] for c in text.split("<td>")[1:]]
    assert not any(c.lower() in ("nan", "inf") for c in cells) and "--" in cells  # NaN metric: a hole
    assert "http" not in text  # self-contained: nothing fetched when opened offline
