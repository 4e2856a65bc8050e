import yaml

from state_reduction.ralimp.benchmark import CONFIG, cells, method_options


def test_cells_cover_the_grid_once():
    cfg = yaml.safe_load(CONFIG.read_text())
    for profile in cfg["profiles"]:
        names = [n for n, _ in cells(cfg, profile)]
        seeds = len(cfg["profiles"][profile]["seeds"])
        sweep = cfg["budget_sweep"]
        extra = len(sweep["activations"]) * len(sweep["methods"]) * sum(b != cfg["budget"] for b in sweep["budgets"])
        assert len(names) == len(set(names)) == seeds * (len(cfg["activations"]) * len(cfg["methods"]) + extra)


def test_ralimp_budget_split():
    cfg = yaml.safe_load(CONFIG.read_text())
    assert method_options(cfg, "ralimp", 32)["poly_features"] == 8          # App. D.1: 8 of 32
    for budget in (16, 64, 128):
        poly = method_options(cfg, "ralimp", budget)["poly_features"]
        assert poly == budget // 4 and (budget - poly) % (2 * 3) == 0
