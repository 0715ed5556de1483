import pytest

from core.config import ConfigError, ConfigSpec, Key, parse_set
from pipelines.pruned_synth import CONFIG

SPEC = ConfigSpec((
    Key("n", int, 10, "rows", low=0),
    Key("eps", float, 0.1, "a probability", low=0.0, high=1.0),
    Key("mode", str, "a", "mode", choices=("a", "b")),
    Key("path", str, None, "a file", optional=True, is_path=True, gridable=False),
))


def test_defaults_then_file_then_sets(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("n: 5\neps: 0.5\n")
    r = SPEC.resolve(str(cfg), ["eps=0.25"])
    assert r.values == {"n": 5, "eps": 0.25, "mode": "a", "path": None}
    assert r.grid == [r.values] and r.swept == []


def test_grid_is_the_product_of_list_values_in_key_order():
    r = SPEC.resolve(None, ["eps=[0, 0.5]", "n=[1,2,3]"])
    assert r.swept == ["n", "eps"]
    assert [(g["n"], g["eps"]) for g in r.grid] == [(1, 0.0), (1, 0.5), (2, 0.0), (2, 0.5), (3, 0.0), (3, 0.5)]


@pytest.mark.parametrize("sets, message", [
    (["nn=3"], "unknown key 'nn' (did you mean 'n'?)"),
    (["n=abc"], "key 'n' expects an int, got 'abc'"),
    (["n=1.5"], "key 'n' expects an int, got 1.5"),
    (["eps=1.5"], "key 'eps' must be in [0, 1], got 1.5"),
    (["eps=[0.2, -1]"], "key 'eps' must be in [0, 1], got -1.0"),
    (["mode=c"], "key 'mode' must be one of ['a', 'b'], got 'c'"),
    (["path=/no/such/file"], "key 'path': file '/no/such/file' not found"),
    (["path=[a,b]"], "key 'path' takes one value, not a list"),
    (["n=[]"], "key 'n': an empty list gives no experiment"),
    (["novalue"], "--set expects key=value, got 'novalue'"),
])
def test_each_mistake_names_key_and_problem(sets, message):
    with pytest.raises(ConfigError) as err:
        SPEC.resolve(None, sets)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file '.*missing.yaml' not found"):
        SPEC.resolve(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("n: [1,\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        SPEC.resolve(str(bad))
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("m: 3\n")
    with pytest.raises(ConfigError, match="unknown key 'm'"):
        SPEC.resolve(str(unknown))
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        SPEC.resolve(str(scalar))


def test_scientific_notation_for_counts():
    assert SPEC.resolve(None, ["n=1e4"]).values["n"] == 10000
    with pytest.raises(ConfigError, match="key 'n' expects an int, got '1.5e0'"):
        SPEC.resolve(None, ["n=1.5e0"])


def test_parse_set_values():
    assert parse_set("a=1") == ("a", 1)
    assert parse_set("a=[1, 2]") == ("a", [1, 2])
    assert parse_set("a=hello") == ("a", "hello")
    assert parse_set("a=") == ("a", None)


@pytest.mark.parametrize("sets, message", [
    (["n=0", "m=0"], "n + m = 0"),
    (["verifier=learned", "n=0"], "verifier=learned trains on the real rows"),
    (["phi=1.2"], "key 'phi' must be in [0, 1]"),
    (["rho=-0.1"], "key 'rho' must be in [0, 1]"),
    (["gamma=0"], "key 'gamma' must be in"),
    (["verifier=oracle"], "key 'verifier' must be one of"),
])
def test_pruned_synth_cross_key_checks(sets, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("+", r"\+")):
        CONFIG.resolve(None, sets)


@pytest.mark.parametrize("trainer, old, new", [("selfmoe", "steps", "max_steps"), ("rmaxts", "steps", "max_steps"),
                                               ("multiui", "learning_rate", "lr"), ("multiui", "batch", "batch_size")])
def test_one_thing_has_one_name_in_every_trainer(trainer, old, new):
    """max_steps, batch_size and lr are spelled one way; the names people reach for are refused with the fix."""
    import importlib
    module = {"selfmoe": "selfmoe.training"}.get(trainer, trainer)
    spec = importlib.import_module(f"trainers.{module}").CONFIG
    assert spec.key(new).name == new
    with pytest.raises(ConfigError, match=f"unknown key '{old}' \\(did you mean '{new}'\\?"):
        spec.resolve(None, [f"{old}=2"])
