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


def test_the_h20_preset_is_its_datasheet_on_the_h100s_fabric(cli):
    """The H20 (NVIDIA HGX H20: 148 TFLOP/s dense bf16, 96 GB of HBM3 at 4.0 TB/s, NVLink 4): the
    H100's fitted efficiencies and links, its own peaks; a job planned on it (`--device h20`)
    trains more slowly than on H100s by at most the peaks' ratio, and generates less slowly than it
    trains (decoding reads weights and the cache, on a faster HBM; a large batch's matmuls
    still find the compute cut)."""
    import json

    h100, h20 = cluster(1, 8, "h100"), cluster(1, 8, "h20")
    assert (h20.device.flops, h20.device.mem_bw, h20.device.memory_bytes) == (148e12, 4.0e12, 96 * 1024**3)
    assert h20.model_dump(exclude={"device"}) == h100.model_dump(exclude={"device"})
    seconds = {}
    for device in ("h100", "h20"):
        code, out, err = cli("estimate", "--scenario", "grpo-qwen3-8b-8gpu", "--baseline", "symmetric",
                             "--device", device, "--json")
        assert code == 0, err
        seconds[device] = json.loads(out)["calls"]
    train = seconds["h20"]["actor_train"]["time_s"] / seconds["h100"]["actor_train"]["time_s"]
    assert 1 < train <= 989 / 148
    assert seconds["h20"]["actor_gen"]["time_s"] / seconds["h100"]["actor_gen"]["time_s"] < train


def test_the_h200_preset_is_the_h100_with_its_own_memory(tmp_path, monkeypatch, cli):
    """The H200 (datasheet: the H100's GH100 die with 141 GB of HBM3e at 4.8 TB/s, on the same
    NVLink 4 fabric): the H100's compute, efficiencies and links, its own memory and bandwidth.
    On a GRPO job written with `device: h200`, under the same plan as on H100s, generation (bound
    by reading weights and the cache) estimates faster, by no more than the bandwidths' ratio, and
    training (bound by the matmuls) hardly moves; a profile made on an H200 names the preset."""
    import json

    import yaml

    from realbench.hardware.profile import this_machine
    from realbench.plan.builtin import _SPECS
    from realbench.plan.scenario import SCENARIO_SCHEMA

    h100, h200 = cluster(2, 8, "h100"), cluster(2, 8, "h200")
    assert h200.device.memory_bytes == 141e9 and h200.device.mem_bw == 4.8e12
    assert h200.device.model_dump(exclude={"name", "memory_bytes", "mem_bw"}) == \
        h100.device.model_dump(exclude={"name", "memory_bytes", "mem_bw"})
    assert h200.model_dump(exclude={"device"}) == h100.model_dump(exclude={"device"})

    spec = next(s for s in _SPECS if s["name"] == "grpo-7b-16gpu")
    for device in ("h100", "h200"):
        (tmp_path / f"my-{device}-job.yaml").write_text(yaml.safe_dump(
            {"schema": SCENARIO_SCHEMA, **spec, "name": f"my-{device}-job", "cluster": {**spec["cluster"], "device": device}}))
    code, _, err = cli("estimate", "--scenario", tmp_path / "my-h100-job.yaml", "--baseline", "symmetric",
                       "--out", tmp_path / "plan.yaml")
    assert code == 0, err
    plan = (tmp_path / "plan.yaml").read_text()
    assert "scenario: my-h100-job.yaml" in plan
    (tmp_path / "plan-h200.yaml").write_text(plan.replace("scenario: my-h100-job.yaml", "scenario: my-h200-job.yaml"))
    times = {}
    for device, plan_file in (("h100", "plan.yaml"), ("h200", "plan-h200.yaml")):  # the same plan on both
        code, out, err = cli("estimate", "--scenario", tmp_path / f"my-{device}-job.yaml", "--plan", tmp_path / plan_file,
                             "--json")
        assert code == 0, err
        times[device] = {k: v["time_s"] for k, v in json.loads(out)["calls"].items()}
    gen = times["h100"]["actor_gen"] / times["h200"]["actor_gen"]
    assert 1.1 < gen <= 4.8 / 3.35 + 1e-9, gen
    assert times["h200"]["actor_train"] == pytest.approx(times["h100"]["actor_train"], rel=0.1)

    monkeypatch.setattr("torch.cuda.get_device_name", lambda *a: "NVIDIA H200")
    assert this_machine("cuda", 1, 1).preset == "h200"
    monkeypatch.setattr("torch.cuda.get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert this_machine("cuda", 1, 1).preset == "h100"
