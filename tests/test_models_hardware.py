import pytest

from realbench.errors import ConfigError
from realbench.hardware import DEVICES, cluster
from realbench.models import PUBLISHED_PARAMS, ModelSpec, get_model


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_counts_match_published_sizes(name):
    assert get_model(name).n_params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.02)


def test_real_shapes():
    m70 = get_model("llama-70b")
    assert (m70.n_layers, m70.hidden, m70.n_heads, m70.n_kv_heads, m70.ffn, m70.vocab) == (80, 8192, 64, 8, 28672, 32000)
    assert get_model("llama-7b").n_kv_heads == 32


def test_value_head_replaces_lm_head():
    m = get_model("llama-7b")
    v = m.with_value_head()
    assert m.n_params - v.n_params == m.vocab * m.hidden - m.hidden
    assert v.head_out == 1


def test_tiny_models_are_small():
    assert get_model("llama-tiny").n_params < 250_000 < get_model("llama-small").n_params * 2


def test_bad_specs():
    with pytest.raises(ValueError):
        ModelSpec(name="x", n_layers=2, hidden=65, n_heads=4, n_kv_heads=2, ffn=8, vocab=8)
    with pytest.raises(ValueError):
        ModelSpec(name="x", n_layers=2, hidden=64, n_heads=4, n_kv_heads=3, ffn=8, vocab=8)
    with pytest.raises(ConfigError, match="unknown model"):
        get_model("gpt-5")


def test_cluster_presets():
    c = cluster(2, 8, "h100")
    assert c.n_devices == 16 and c.node_of(9) == 1
    assert c.intra_bw > c.inter_bw
    assert set(DEVICES) >= {"h100", "a100", "cpu"}
    with pytest.raises(ValueError, match="power of two"):
        cluster(1, 6, "h100")


def test_processes_share_cores_only_on_a_cpu_with_more_processes_than_cores():
    from realbench.hardware.profile import shares_cores

    assert shares_cores("cpu", 4, 2) and not shares_cores("cpu", 2, 2) and not shares_cores("cpu", 1, 2)
    assert not shares_cores("cuda", 8, 2)  # a GPU process does not compute on the cores
    assert not shares_cores("cpu", 4, 0)  # an old profile that did not record its cores
