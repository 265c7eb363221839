"""The Kronos tokenizer: the spec's math, its checkpoint layout, and strict loading."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from kronos_mlflow.errors import CheckpointError, ConfigError
from kronos_mlflow.model import (
    BASE_CONFIG,
    BinarySphericalQuantizer,
    BSQuantizer,
    KronosTokenizer,
    count_parameters,
)

TINY = {
    "d_in": 6,
    "d_model": 32,
    "n_heads": 2,
    "ff_dim": 64,
    "n_enc_layers": 2,
    "n_dec_layers": 2,
    "ffn_dropout_p": 0.0,
    "attn_dropout_p": 0.0,
    "resid_dropout_p": 0.0,
    "s1_bits": 4,
    "s2_bits": 4,
    "beta": 0.05,
    "gamma0": 1.0,
    "gamma": 1.1,
    "zeta": 0.05,
    "group_size": 4,
}

SPEC_BASE = {
    "d_in": 6, "d_model": 256, "n_heads": 4, "ff_dim": 512, "n_enc_layers": 4, "n_dec_layers": 4,
    "ffn_dropout_p": 0.0, "attn_dropout_p": 0.0, "resid_dropout_p": 0.0, "s1_bits": 10, "s2_bits": 10,
    "beta": 0.05, "gamma0": 1.0, "gamma": 1.1, "zeta": 0.05, "group_size": 4,
}


def spec_table(cfg: dict) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Tensor name -> (shape, dtype), written from the spec's list, independently of model.py."""
    d, f, d_in = cfg["d_model"], cfg["ff_dim"], cfg["d_in"]
    s1 = cfg["s1_bits"]
    c = s1 + cfg["s2_bits"]
    h = cfg["n_heads"]
    fl, i64 = torch.float32, torch.int64
    table = {
        "embed.weight": ((d, d_in), fl), "embed.bias": ((d,), fl),
        "head.weight": ((d_in, d), fl), "head.bias": ((d_in,), fl),
        "quant_embed.weight": ((c, d), fl), "quant_embed.bias": ((c,), fl),
        "post_quant_embed_pre.weight": ((d, s1), fl), "post_quant_embed_pre.bias": ((d,), fl),
        "post_quant_embed.weight": ((d, c), fl), "post_quant_embed.bias": ((d,), fl),
        "tokenizer.bsq.basis": ((c,), i64),
        "tokenizer.bsq.group_basis": ((cfg["group_size"],), i64),
    }
    blocks = [f"encoder.{i}" for i in range(cfg["n_enc_layers"] - 1)]
    blocks += [f"decoder.{i}" for i in range(cfg["n_dec_layers"] - 1)]
    for b in blocks:
        table[f"{b}.norm1.weight"] = ((d,), fl)
        table[f"{b}.norm2.weight"] = ((d,), fl)
        for p in ("q", "k", "v", "out"):
            table[f"{b}.self_attn.{p}_proj.weight"] = ((d, d), fl)
            table[f"{b}.self_attn.{p}_proj.bias"] = ((d,), fl)
        table[f"{b}.self_attn.rotary.inv_freq"] = ((d // h // 2,), fl)
        table[f"{b}.ffn.w1.weight"] = ((f, d), fl)
        table[f"{b}.ffn.w3.weight"] = ((f, d), fl)
        table[f"{b}.ffn.w2.weight"] = ((d, f), fl)
    return table


def spec_tensors(cfg: dict, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Random tensors in the published layout (buffers with their defined values)."""
    gen = torch.Generator().manual_seed(seed)
    c = cfg["s1_bits"] + cfg["s2_bits"]
    head_dim = cfg["d_model"] // cfg["n_heads"]
    out = {}
    for name, (shape, kind) in spec_table(cfg).items():
        if name == "tokenizer.bsq.basis":
            out[name] = torch.tensor([2 ** (c - 1 - i) for i in range(c)], dtype=torch.int64)
        elif name == "tokenizer.bsq.group_basis":
            g = cfg["group_size"]
            out[name] = torch.tensor([2 ** (g - 1 - i) for i in range(g)], dtype=torch.int64)
        elif name.endswith("rotary.inv_freq"):
            out[name] = torch.tensor([1.0 / 10000 ** (2 * j / head_dim) for j in range(head_dim // 2)]).to(dtype)
        else:
            out[name] = (torch.randn(shape, generator=gen) * 0.2).to(dtype)
    return out


def write_checkpoint(directory, cfg: dict, tensors: dict[str, torch.Tensor]) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh, sort_keys=True, indent=2)
    save_file(tensors, os.path.join(directory, "model.safetensors"))


def tiny_model(seed: int = 0, **overrides) -> KronosTokenizer:
    torch.manual_seed(seed)
    model = KronosTokenizer(**{**TINY, **overrides})
    with torch.no_grad():  # move RMSNorm weights and biases off their defaults
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def sample_x(b: int = 3, t: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, t, 6, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------------------------


def test_base_config_matches_spec_names_shapes_and_size():
    assert BASE_CONFIG == SPEC_BASE
    model = KronosTokenizer.base()
    assert model.config == SPEC_BASE
    state = model.state_dict()
    table = spec_table(SPEC_BASE)
    assert len(table) == 96
    assert set(state) == set(table)
    for name, (shape, dtype) in table.items():
        assert tuple(state[name].shape) == shape, name
        assert state[name].dtype == dtype, name
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == count_parameters(SPEC_BASE) == 3_958_042
    assert state["tokenizer.bsq.basis"].tolist() == [2 ** i for i in range(19, -1, -1)]
    assert state["tokenizer.bsq.group_basis"].tolist() == [8, 4, 2, 1]
    assert len(model.encoder) == 3 and len(model.decoder) == 3


def _no_build(*args, **kwargs):
    raise AssertionError("a layer was built before the config was checked")


def test_config_attribute_and_constructor_validation():
    model = KronosTokenizer(**TINY)
    assert model.config == TINY and list(model.config) == sorted(TINY)
    with pytest.MonkeyPatch.context() as mp, pytest.raises(ConfigError, match="d_model"):
        mp.setattr(torch.nn.Linear, "__init__", _no_build)  # rejected before any allocation
        KronosTokenizer(**{**TINY, "d_model": 10_000_000})
    with pytest.raises(ConfigError, match="n_heads"):
        KronosTokenizer(**{**TINY, "n_heads": True})


# ---------------------------------------------------------------------------------------------
# Checkpoints: round trip and the published layout
# ---------------------------------------------------------------------------------------------


def test_save_load_round_trip_gives_identical_outputs(tmp_path):
    model = tiny_model()
    out_dir = tmp_path / "a" / "b"  # created, parents too
    assert model.save_pretrained(out_dir) == str(out_dir)
    assert sorted(os.listdir(out_dir)) == ["config.json", "model.safetensors"]  # no temp files left
    text = (out_dir / "config.json").read_text(encoding="utf-8")
    assert text == json.dumps(TINY, sort_keys=True, indent=2)

    loaded = KronosTokenizer.from_pretrained(out_dir)
    assert not loaded.training
    assert loaded.config == model.config
    x = sample_x()
    with torch.no_grad():
        (a_pre, a_z), a_loss, a_q, a_idx = model(x)
        (b_pre, b_z), b_loss, b_q, b_idx = loaded(x)
    for a, b in ((a_pre, b_pre), (a_z, b_z), (a_loss, b_loss), (a_q, b_q), (a_idx, b_idx)):
        assert torch.equal(a, b)
    assert a_idx.dtype == torch.int64 and a_idx.shape == (3, 12)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_save_overwrites_atomically_and_cleans_up_on_failure(tmp_path, monkeypatch):
    import safetensors.torch

    first = tiny_model(seed=0)
    first.save_pretrained(tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()

    def boom(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError):
        tiny_model(seed=1).save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    assert (tmp_path / "model.safetensors").read_bytes() == before
    monkeypatch.undo()
    tiny_model(seed=1).save_pretrained(tmp_path)  # overwriting works and leaves nothing behind
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    assert (tmp_path / "model.safetensors").read_bytes() != before


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_strict_load_of_published_layout(tmp_path, dtype):
    tensors = spec_tensors(TINY, dtype=dtype)
    write_checkpoint(tmp_path, TINY, tensors)
    model = KronosTokenizer.from_pretrained(str(tmp_path))
    state = model.state_dict()
    assert set(state) == set(tensors)
    for name, tensor in tensors.items():
        want = tensor.float() if tensor.is_floating_point() else tensor
        assert state[name].dtype == want.dtype, name
        assert torch.equal(state[name], want), name


def test_upstream_style_hub_mixin_loads_our_save(tmp_path):
    """huggingface_hub's PyTorchModelHubMixin (what upstream Kronos uses) reads our directory strictly."""
    from huggingface_hub import PyTorchModelHubMixin

    class MixinTokenizer(PyTorchModelHubMixin, KronosTokenizer):
        pass

    model = tiny_model()
    model.save_pretrained(tmp_path)
    other = MixinTokenizer.from_pretrained(str(tmp_path), strict=True)
    x = sample_x()
    with torch.no_grad():
        assert torch.equal(model(x)[0][1], other(x)[0][1])


def test_hub_id_resolves_through_snapshot_download(tmp_path, monkeypatch):
    import huggingface_hub

    from huggingface_hub import constants

    model = tiny_model()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # a snapshot lies inside the cache
    snapshot = tmp_path / "hf-cache" / "models--NeoQuasar--Kronos-Tokenizer-base" / "snapshots" / ("0" * 40)
    model.save_pretrained(snapshot)
    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append(repo_id)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.chdir(tmp_path)
    loaded = KronosTokenizer.from_pretrained("NeoQuasar/Kronos-Tokenizer-base")
    assert calls == ["NeoQuasar/Kronos-Tokenizer-base"]
    assert torch.equal(loaded.embed.weight, model.embed.weight)


def test_unreachable_hub_id_offline(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as info:
        KronosTokenizer.from_pretrained("no-such-owner-zz/no-such-tokenizer")
    msg = str(info.value)
    assert "no-such-owner-zz/no-such-tokenizer" in msg and "could not be reached" in msg
    assert "huggingface-cli download" in msg and "\n" not in msg

    def refuse(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(CheckpointError, match="could not be reached"):
        KronosTokenizer.from_pretrained("NeoQuasar/Kronos-Tokenizer-base")


# ---------------------------------------------------------------------------------------------
# Load failures: one line, naming the file
# ---------------------------------------------------------------------------------------------


def _edit_config(**changes):
    def edit(d):
        cfg = json.loads((d / "config.json").read_text())
        for key, value in changes.items():
            if value is _DROP:
                del cfg[key]
            else:
                cfg[key] = value
        (d / "config.json").write_text(json.dumps(cfg))
    return edit


def _edit_tensors(fn):
    def edit(d):
        from safetensors.torch import load_file
        tensors = load_file(d / "model.safetensors")
        fn(tensors)
        save_file(tensors, d / "model.safetensors")
    return edit


_DROP = object()


def _truncate(d):
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])


FAILURES = {
    "no config.json": (lambda d: (d / "config.json").unlink(), "config.json"),
    "no model.safetensors": (lambda d: (d / "model.safetensors").unlink(), "model.safetensors"),
    "config not JSON": (lambda d: (d / "config.json").write_text("{not json"), "config.json"),
    "config not UTF-8": (lambda d: (d / "config.json").write_bytes(b'{"d_in": "\xff\xfe"}'), "UTF-8"),
    "config not an object": (lambda d: (d / "config.json").write_text("[1, 2]"), "config.json"),
    "config key missing": (_edit_config(zeta=_DROP), "'zeta'"),
    "config key unknown": (_edit_config(d_modle=32), "'d_modle'"),
    "config value str": (_edit_config(d_model="32"), "d_model"),
    "config value bool": (_edit_config(n_heads=True), "n_heads"),
    "config value float for int": (_edit_config(ff_dim=64.0), "ff_dim"),
    "config value null": (_edit_config(beta=None), "beta"),
    "config absurd d_model": (_edit_config(d_model=10_000_000), "d_model"),
    "config too many params": (_edit_config(d_model=65536, ff_dim=262144, n_enc_layers=256), "parameters"),
    "config heads don't split": (_edit_config(n_heads=3), "n_heads"),
    "config odd head dim": (_edit_config(n_heads=32), "even"),
    "config zero bits": (_edit_config(s1_bits=0), "s1_bits"),
    "config 32 bits": (_edit_config(s2_bits=32), "s2_bits"),
    "config dropout 1": (_edit_config(attn_dropout_p=1.0), "attn_dropout_p"),
    "config group_size": (_edit_config(group_size=3), "group_size"),
    "weights truncated": (_truncate, "model.safetensors"),
    "weights garbage": (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 7), "model.safetensors"),
    "weights not matching config": (_edit_config(d_model=64), "embed.weight"),
    "wrong shape": (_edit_tensors(lambda t: t.__setitem__("head.bias", torch.zeros(7))), "'head.bias'"),
    "extra tensor": (_edit_tensors(lambda t: t.__setitem__("extra.weight", torch.zeros(2))), "'extra.weight'"),
    "missing tensor": (_edit_tensors(lambda t: t.pop("encoder.0.ffn.w2.weight")), "'encoder.0.ffn.w2.weight'"),
    "int dtype for float": (
        _edit_tensors(lambda t: t.__setitem__("head.bias", torch.zeros(6, dtype=torch.int32))), "'head.bias'"),
    "float dtype for int buffer": (
        _edit_tensors(lambda t: t.__setitem__("tokenizer.bsq.basis", torch.zeros(8))), "I64"),
    "basis values": (
        _edit_tensors(lambda t: t.__setitem__("tokenizer.bsq.basis", torch.arange(8))), "tokenizer.bsq.basis"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_load_failures_raise_one_line_checkpoint_error(tmp_path, case):
    edit, needle = FAILURES[case]
    directory = tmp_path / "ckpt"
    tiny_model().save_pretrained(directory)
    edit(directory)
    with pytest.raises(CheckpointError) as info:
        KronosTokenizer.from_pretrained(directory)
    msg = str(info.value)
    assert "\n" not in msg
    assert needle in msg
    filename = "config.json" if case.startswith("config") else "model.safetensors"
    if case.startswith("no "):
        filename = str(directory)
    assert filename in msg


def test_missing_directory_and_file_path(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist") as info:
        KronosTokenizer.from_pretrained(tmp_path / "nope" / "deeper")
    assert str(tmp_path / "nope" / "deeper") in str(info.value)
    tiny_model().save_pretrained(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="is a file, not a directory") as info:
        KronosTokenizer.from_pretrained(tmp_path / "ckpt" / "config.json")
    assert "config.json" in str(info.value)


def test_absurd_config_fails_fast_without_building(tmp_path, monkeypatch):
    directory = tmp_path / "ckpt"
    tiny_model().save_pretrained(directory)
    _edit_config(d_model=10_000_000, ff_dim=200_000)(directory)

    monkeypatch.setattr(torch.nn.Linear, "__init__", _no_build)
    with pytest.raises(CheckpointError, match="d_model is 10000000, too large"):
        KronosTokenizer.from_pretrained(directory)


# ---------------------------------------------------------------------------------------------
# encode / decode
# ---------------------------------------------------------------------------------------------


def test_decode_of_encode_equals_forward_z():
    model = tiny_model()
    x = sample_x()
    with torch.no_grad():
        (_, z), _, q, idx = model(x)
        full = model.encode(x)
        halves = model.encode(x, half=True)
        assert torch.equal(full, idx)
        torch.testing.assert_close(model.decode(full), z, atol=1e-6, rtol=0)
        torch.testing.assert_close(model.decode(halves, half=True), z, atol=1e-6, rtol=0)
        assert torch.equal(model.indices_to_bits(full), q)


def test_half_indices_are_low_and_high_bits():
    model = tiny_model(s1_bits=3, s2_bits=5, group_size=4)  # unequal halves on purpose
    x = sample_x(b=4, t=20)
    with torch.no_grad():
        full = model.encode(x)
        s1, s2 = model.encode(x, half=True)
        z = model(x)[0][1]
        torch.testing.assert_close(model.decode([s1, s2], half=True), z, atol=1e-6, rtol=0)
    assert torch.equal(s1, full & (2 ** 3 - 1))
    assert torch.equal(s2, full >> 3)
    assert int(full.max()) < 2 ** 8 and int(full.min()) >= 0


def test_attention_is_causal():
    model = tiny_model()
    x = sample_x(t=10)
    y = x.clone()
    y[:, 6:] += 3.0
    with torch.no_grad():
        (pre_x, z_x), _, _, idx_x = model(x)
        (pre_y, z_y), _, _, idx_y = model(y)
    torch.testing.assert_close(z_x[:, :6], z_y[:, :6], atol=1e-6, rtol=0)
    torch.testing.assert_close(pre_x[:, :6], pre_y[:, :6], atol=1e-6, rtol=0)
    assert torch.equal(idx_x[:, :6], idx_y[:, :6])
    assert not torch.allclose(z_x[:, 6:], z_y[:, 6:])


def test_rotary_tables_follow_loaded_inv_freq():
    a, b = tiny_model(seed=0), tiny_model(seed=0)
    x = sample_x()
    with torch.no_grad():
        a(x)  # builds a's cos/sin cache
        b.decoder[0].self_attn.rotary.inv_freq.mul_(0.5)
        a.load_state_dict(b.state_dict())
        torch.testing.assert_close(a(x)[0][1], b(x)[0][1], atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# The quantizer
# ---------------------------------------------------------------------------------------------


def make_bsq(c: int = 8) -> BinarySphericalQuantizer:
    return BinarySphericalQuantizer(c, beta=0.05, gamma0=1.0, gamma=1.1, zeta=0.05, group_size=4)


def test_codes_are_scaled_signs_and_zero_maps_to_minus_one():
    bsq = make_bsq(8)
    scale = 1 / math.sqrt(8)
    u = F.normalize(torch.randn(2, 5, 8), dim=-1)
    u[0, 0, 3] = 0.0
    q = bsq.quantize(u)
    assert torch.allclose(q.abs(), torch.full_like(q, scale), atol=0, rtol=1e-7)
    assert torch.equal(q > 0, u > 0)
    assert q[0, 0, 3].item() == pytest.approx(-scale, rel=1e-7)


def test_indices_are_little_endian():
    quantizer = BSQuantizer(4, 4, 0.05, 1.0, 1.1, 0.05, 4)
    z = -torch.ones(1, 3, 8)
    z[0, 0, 0] = 1.0  # channel 0 only -> 1
    z[0, 1, 3] = 1.0  # channel 3 only -> 8
    z[0, 2, 0] = z[0, 2, 7] = 1.0  # channels 0 and 7 -> 129
    _, _, idx = quantizer(z)
    assert idx.tolist() == [[1, 8, 129]]
    s1, s2 = quantizer(z, half=True)[2]
    assert s1.tolist() == [[1, 8, 1]] and s2.tolist() == [[0, 0, 8]]


def test_codebook_entropy_is_c_log2_for_balanced_bits():
    c = 8
    bsq = make_bsq(c)
    u = F.normalize(torch.randn(1, 5, c), dim=-1)
    both = torch.cat([u, -u], dim=0)  # every channel's probability averages to 1/2
    _, _, parts = bsq(both)
    assert parts["codebook_entropy"].item() == pytest.approx(c * math.log(2), abs=1e-6)
    # = groups * log(2 ** group_size)
    assert parts["codebook_entropy"].item() == pytest.approx((c // 4) * math.log(2 ** 4), abs=1e-6)


def test_commitment_is_zero_on_the_code():
    c = 8
    bsq = make_bsq(c)
    signs = torch.tensor([1, -1, 1, 1, -1, -1, 1, -1], dtype=torch.float32)
    u = (signs / math.sqrt(c)).expand(2, 3, c).contiguous()
    _, _, parts = bsq(u)
    assert parts["commitment"].item() == pytest.approx(0.0, abs=1e-12)


def _hand_entropy(p: float) -> float:
    return -(p * math.log(p + 1e-8) + (1 - p) * math.log(1 - p + 1e-8))


def test_per_sample_entropy_and_full_loss_by_hand():
    c = 4
    bsq = make_bsq(c)
    u = F.normalize(torch.tensor([[[0.3, -0.5, 0.1, 0.8]], [[-0.2, -0.4, 0.6, 0.05]]]), dim=-1)  # (2, 1, 4)
    q, loss, parts = bsq(u)
    rows = u.reshape(-1, c).double().tolist()
    probs = [[1 / (1 + math.exp(4 * v / math.sqrt(c))) for v in row] for row in rows]  # sigmoid(-4u/sqrt(C))
    per_sample = sum(sum(_hand_entropy(p) for p in row) for row in probs) / len(rows)
    assert parts["per_sample_entropy"].item() == pytest.approx(per_sample, abs=1e-6)
    # one vector on its own: per-sample and codebook entropies coincide
    _, _, single = bsq(u[:1])
    assert single["per_sample_entropy"].item() == pytest.approx(sum(_hand_entropy(p) for p in probs[0]), abs=1e-6)
    assert single["codebook_entropy"].item() == pytest.approx(single["per_sample_entropy"].item(), abs=1e-6)

    p_mean = [sum(col) / len(rows) for col in zip(*probs)]
    codebook = sum(_hand_entropy(p) for p in p_mean)
    assert parts["codebook_entropy"].item() == pytest.approx(codebook, abs=1e-6)
    scale = 1 / math.sqrt(c)
    commitment = 0.05 * sum(
        sum(((scale if v > 0 else -scale) - v) ** 2 for v in row) for row in rows) / len(rows)
    assert parts["commitment"].item() == pytest.approx(commitment, abs=1e-7)
    want = commitment + 0.05 * (1.0 * per_sample - 1.1 * codebook)
    assert loss.item() == pytest.approx(want, abs=1e-6)
    parts_formula = parts["commitment"] + 0.05 * (parts["per_sample_entropy"] - 1.1 * parts["codebook_entropy"])
    assert torch.equal(loss, parts_formula)


def test_forward_loss_is_the_quantizer_loss_of_the_normalised_code():
    model = tiny_model()
    x = sample_x()
    with torch.no_grad():
        _, loss, q, _ = model(x)
        h = model.embed(x)
        for layer in model.encoder:
            h = layer(h)
        u = F.normalize(model.quant_embed(h), dim=-1)
        q2, loss2, _ = model.tokenizer.bsq(u)
    assert torch.equal(q, q2) and torch.equal(loss, loss2)


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------


def test_straight_through_gradient():
    c = 8
    bsq = make_bsq(c)
    u = F.normalize(torch.randn(2, 3, c), dim=-1).requires_grad_(True)
    bsq.quantize(u).sum().backward()
    assert torch.allclose(u.grad, torch.full_like(u, 1 / math.sqrt(c)), atol=0, rtol=1e-7)


def test_gradients_reach_the_encoder():
    model = tiny_model().train()
    x = sample_x()
    (z_pre, z), bsq_loss, _, _ = model(x)
    loss = (F.mse_loss(z_pre, x) + F.mse_loss(z, x) + bsq_loss) / 2
    loss.backward()
    assert model.embed.weight.grad is not None and model.embed.weight.grad.abs().sum() > 0
    assert model.encoder[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert model.quant_embed.weight.grad.abs().sum() > 0
    assert model.post_quant_embed_pre.weight.grad.abs().sum() > 0
