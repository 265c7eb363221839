"""The Kronos predictor and forecasting: the spec's layout, strict loading both ways, the
network against a reference written from the spec, the key/value cache against recomputing
the window, upstream's kept behaviours (RoPE cache length, eval-mode cross-attention, s2 on a
sampled s1), and ``KronosPredictor``'s DataFrame calls. Tiny architectures; no network."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from kronos_mlflow.errors import ArgumentTypeError, CheckpointError, ConfigError, DataError, MemoryBudgetError
from kronos_mlflow.model import (
    PREDICTOR_CONFIGS,
    Kronos,
    KronosPredictor,
    KronosTokenizer,
    auto_regressive_inference,
    count_predictor_parameters,
    generate_tokens,
    sample_from_logits,
    top_k_top_p_filtering,
)
from kronos_mlflow.model.decoding import IncrementalDecoder, cross_keys, s2_logits_last
from kronos_mlflow.model.forecast import ForecastWarning

TINY = {"s1_bits": 4, "s2_bits": 4, "n_layers": 2, "d_model": 32, "n_heads": 2, "ff_dim": 48,
        "ffn_dropout_p": 0.2, "attn_dropout_p": 0.1, "resid_dropout_p": 0.2, "token_dropout_p": 0.1, "learn_te": True}
NO_DROPOUT = {**TINY, "ffn_dropout_p": 0.0, "attn_dropout_p": 0.0, "resid_dropout_p": 0.0, "token_dropout_p": 0.0}
TOKENIZER = {"d_in": 6, "d_model": 16, "n_heads": 2, "ff_dim": 32, "n_enc_layers": 2, "n_dec_layers": 2,
             "ffn_dropout_p": 0.0, "attn_dropout_p": 0.0, "resid_dropout_p": 0.0, "s1_bits": 4, "s2_bits": 4,
             "beta": 0.05, "gamma0": 1.0, "gamma": 1.1, "zeta": 0.05, "group_size": 4}
TIME_SIZES = {"minute": 60, "hour": 24, "weekday": 7, "day": 32, "month": 13}


def spec_table(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from the spec's prefixes (learn_te true), independently of the model."""
    d, f, h = cfg["d_model"], cfg["ff_dim"], cfg["n_heads"]
    v1, v2 = 2 ** cfg["s1_bits"], 2 ** cfg["s2_bits"]
    table = {"embedding.emb_s1.weight": (v1, d), "embedding.emb_s2.weight": (v2, d),
             "embedding.fusion_proj.weight": (d, 2 * d), "embedding.fusion_proj.bias": (d,),
             "norm.weight": (d,), "dep_layer.norm.weight": (d,), "dep_layer.cross_attn.rotary.inv_freq": (d // 4 // 2,),
             "head.proj_s1.weight": (v1, d), "head.proj_s1.bias": (v1,),
             "head.proj_s2.weight": (v2, d), "head.proj_s2.bias": (v2,)}
    table.update({f"time_emb.{name}_embed.weight": (size, d) for name, size in TIME_SIZES.items()})
    for p in "qkv":
        table[f"dep_layer.cross_attn.{p}_proj.weight"] = (d, d)
        table[f"dep_layer.cross_attn.{p}_proj.bias"] = (d,)
    table["dep_layer.cross_attn.out_proj.weight"], table["dep_layer.cross_attn.out_proj.bias"] = (d, d), (d,)
    for i in range(cfg["n_layers"]):
        b = f"transformer.{i}"
        table[f"{b}.norm1.weight"] = table[f"{b}.norm2.weight"] = (d,)
        for p in ("q", "k", "v", "out"):
            table[f"{b}.self_attn.{p}_proj.weight"], table[f"{b}.self_attn.{p}_proj.bias"] = (d, d), (d,)
        table[f"{b}.self_attn.rotary.inv_freq"] = (d // h // 2,)
        table[f"{b}.ffn.w1.weight"] = table[f"{b}.ffn.w3.weight"] = (f, d)
        table[f"{b}.ffn.w2.weight"] = (d, f)
    return table


def tiny_model(seed: int = 0, **overrides) -> Kronos:
    torch.manual_seed(seed)
    model = Kronos(**{**TINY, **overrides})
    with torch.no_grad():  # RMSNorm gains and biases off their defaults
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def tiny_tokenizer(seed: int = 1) -> KronosTokenizer:
    torch.manual_seed(seed)
    return KronosTokenizer(**TOKENIZER).eval()


def tokens(b: int = 3, t: int = 11, seed: int = 2, bits: int = 4):
    gen = torch.Generator().manual_seed(seed)
    s1 = torch.randint(0, 2 ** bits, (b, t), generator=gen)
    s2 = torch.randint(0, 2 ** bits, (b, t), generator=gen)
    return s1, s2, stamps(b, t, gen)


def stamps(b: int, t: int, gen: torch.Generator) -> torch.Tensor:
    return torch.stack([torch.randint(0, n, (b, t), generator=gen) for n in TIME_SIZES.values()], -1).float()


# ---------------------------------------------------------------------------------------------
# A reference written from the spec (plain tensor ops, no module of the package)
# ---------------------------------------------------------------------------------------------


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def _rope(x, positions):
    half = x.shape[-1] // 2
    inv = 1.0 / 10000 ** (torch.arange(0, 2 * half, 2).float() / (2 * half))
    angle = positions.float()[:, None] * inv[None]
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _attention(sd, prefix, q_in, kv_in, heads, q_pos, k_pos, causal):
    def proj(name, x):
        y = x @ sd[f"{prefix}.{name}.weight"].T + sd[f"{prefix}.{name}.bias"]
        return y.view(*y.shape[:2], heads, -1).transpose(1, 2)

    q, k, v = _rope(proj("q_proj", q_in), q_pos), _rope(proj("k_proj", kv_in), k_pos), proj("v_proj", kv_in)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(q_in.shape[0], q_in.shape[1], -1)
    return out @ sd[f"{prefix}.out_proj.weight"].T + sd[f"{prefix}.out_proj.bias"]


def reference_context(model: Kronos, s1, s2, stamp):
    sd, cfg = model.state_dict(), model.config
    d = cfg["d_model"]
    x = torch.cat([sd["embedding.emb_s1.weight"][s1] * math.sqrt(d), sd["embedding.emb_s2.weight"][s2] * math.sqrt(d)], -1)
    x = x @ sd["embedding.fusion_proj.weight"].T + sd["embedding.fusion_proj.bias"]
    x = x + sum(sd[f"time_emb.{n}_embed.weight"][stamp[..., i].long()] for i, n in enumerate(TIME_SIZES))
    pos = torch.arange(s1.shape[1])
    for i in range(cfg["n_layers"]):
        b = f"transformer.{i}"
        h = _rms(x, sd[f"{b}.norm1.weight"])
        x = x + _attention(sd, f"{b}.self_attn", h, h, cfg["n_heads"], pos, pos, causal=True)
        h = _rms(x, sd[f"{b}.norm2.weight"])
        x = x + (F.silu(h @ sd[f"{b}.ffn.w1.weight"].T) * (h @ sd[f"{b}.ffn.w3.weight"].T)) @ sd[f"{b}.ffn.w2.weight"].T
    return _rms(x, sd["norm.weight"])


def reference_s2(model: Kronos, h, s1_cond, q_pos, k_pos, causal):
    sd = model.state_dict()
    attn = _attention(sd, "dep_layer.cross_attn", sd["embedding.emb_s1.weight"][s1_cond], h, 4, q_pos, k_pos, causal)
    residual = h[:, -attn.shape[1]:]
    return _rms(residual + attn, sd["dep_layer.norm.weight"]) @ sd["head.proj_s2.weight"].T + sd["head.proj_s2.bias"]


# ---------------------------------------------------------------------------------------------
# Layout, config, sizes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,size", [("Kronos-mini", 4_108_032), ("Kronos-small", 24_741_376),
                                       ("Kronos-base", 102_310_592)])
def test_published_architectures_have_the_spec_names_shapes_and_sizes(name, size):
    cfg = PREDICTOR_CONFIGS[name]
    with torch.device("meta"):
        model = Kronos(**cfg)
    state = model.state_dict()
    table = spec_table(cfg)
    assert set(state) == set(table)
    assert all(tuple(state[k].shape) == shape for k, shape in table.items())
    assert sum(p.numel() for p in model.parameters()) == count_predictor_parameters(cfg) == size
    assert round(size / 1e6, 1) == {"Kronos-mini": 4.1, "Kronos-small": 24.7, "Kronos-base": 102.3}[name]


def test_fixed_time_tables_keep_upstreams_names_and_stay_frozen(tmp_path):
    model = tiny_model(learn_te=False)
    assert {k for k in model.state_dict() if k.startswith("time_emb")} == {
        f"time_emb.{n}_embed.emb.weight" for n in TIME_SIZES}
    assert not any(p.requires_grad for p in model.time_emb.parameters())
    model.save_pretrained(tmp_path)
    s1, s2, stamp = tokens()
    with torch.no_grad():
        torch.testing.assert_close(Kronos.from_pretrained(tmp_path).decode_s1(s1, s2, stamp)[0],
                                   model.decode_s1(s1, s2, stamp)[0], rtol=0, atol=0)


def test_config_is_checked_before_anything_is_built():
    model = Kronos(**TINY)
    assert model.config == TINY and list(model.config) == sorted(TINY)
    assert model.s1_vocab_size == 16 and model.learn_te is True and model.n_layers == 2
    for bad, needle in [({"learn_te": 1}, "learn_te"), ({"n_heads": 3}, "n_heads"), ({"token_dropout_p": 1.0}, "token_dropout_p"),
                        ({"d_model": 12, "n_heads": 2}, "dependency-aware"), ({"n_layers": 0}, "n_layers")]:
        with pytest.raises(ConfigError, match=needle) as info:
            Kronos(**{**TINY, **bad})
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="Kronos-tiny"):
        Kronos.published("Kronos-tiny")


# ---------------------------------------------------------------------------------------------
# Checkpoints: our directory, upstream's mixin, strict loading
# ---------------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["config.json", "model.safetensors"]
    assert (tmp_path / "ckpt" / "config.json").read_text() == json.dumps(TINY, sort_keys=True, indent=2)
    loaded = Kronos.from_pretrained(tmp_path / "ckpt")
    assert not loaded.training and loaded.config == TINY
    s1, s2, stamp = tokens()
    with torch.no_grad():
        for a, b in zip(model(s1, s2, stamp, use_teacher_forcing=True, s1_targets=s1),
                        loaded(s1, s2, stamp, use_teacher_forcing=True, s1_targets=s1)):
            assert torch.equal(a, b)


def _mixin_class():
    from huggingface_hub import PyTorchModelHubMixin

    class MixinKronos(PyTorchModelHubMixin, Kronos):  # how upstream's Kronos is declared
        pass

    return MixinKronos


def test_upstream_style_hub_mixin_loads_ours_and_we_load_its_save(tmp_path):
    mixin = _mixin_class()
    model = tiny_model()
    model.save_pretrained(tmp_path / "ours")
    theirs = mixin.from_pretrained(str(tmp_path / "ours"), strict=True)
    s1, s2, stamp = tokens()
    with torch.no_grad():
        assert torch.equal(theirs.decode_s1(s1, s2, stamp)[0], model.decode_s1(s1, s2, stamp)[0])
    theirs.save_pretrained(tmp_path / "theirs")  # the mixin's own writer: config.json from its init kwargs
    back = Kronos.from_pretrained(tmp_path / "theirs")
    assert back.config == TINY
    for name, tensor in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_a_checkpoint_written_from_the_spec_table_loads_strictly(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {k: torch.randn(shape, generator=gen) for k, shape in spec_table(TINY).items()}
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    save_file(tensors, tmp_path / "model.safetensors")
    state = Kronos.from_pretrained(tmp_path).state_dict()
    assert all(torch.equal(state[k], t) for k, t in tensors.items())


def _edit(on_tensors=None, **config):
    """An edit of a saved checkpoint: ``on_tensors`` applied to its tensors, then ``config`` keys set
    in its config.json (a None value drops the key)."""
    def edit(d):
        if on_tensors is not None:
            state = load_file(d / "model.safetensors")
            on_tensors(state)
            save_file(state, d / "model.safetensors")
        cfg = {**json.loads((d / "config.json").read_text()), **config}
        (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return edit


def _pickle_only(d):
    (d / "model.safetensors").rename(d / "pytorch_model.bin")


LOAD_FAILURES = {
    "missing tensor": (_edit(lambda t: t.pop("dep_layer.cross_attn.k_proj.bias")), "'dep_layer.cross_attn.k_proj.bias'"),
    "unexpected tensor": (_edit(lambda t: t.__setitem__("head.proj_s3.weight", torch.zeros(2))), "'head.proj_s3.weight'"),
    "renamed tensor": (_edit(lambda t: t.__setitem__("head.s1.weight", t.pop("head.proj_s1.weight"))), "'head.proj_s1.weight'"),
    "wrong shape": (_edit(lambda t: t.__setitem__("norm.weight", torch.ones(7))), "'norm.weight'"),
    "non-finite weight": (_edit(lambda t: t["transformer.1.ffn.w2.weight"].__setitem__((0, 0), float("nan"))),
                          "'transformer.1.ffn.w2.weight'"),
    "pickle only": (_pickle_only, "pytorch_model.bin"),
    "config key missing": (_edit(learn_te=None), "'learn_te'"),
    "config learn_te not a bool": (_edit(learn_te="yes"), "learn_te"),
    "config from the tokenizer": (_edit(d_in=6), "'d_in'"),
}


@pytest.mark.parametrize("case", sorted(LOAD_FAILURES))
def test_load_failures_are_one_line_checkpoint_errors(tmp_path, case):
    edit, needle = LOAD_FAILURES[case]
    tiny_model().save_pretrained(tmp_path)
    edit(tmp_path)
    with pytest.raises(CheckpointError) as info:
        Kronos.from_pretrained(tmp_path)
    assert needle in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# The network against the reference; upstream's kept behaviours
# ---------------------------------------------------------------------------------------------


def test_network_equals_the_reference_in_both_modes_of_the_cross_attention():
    model = tiny_model(**NO_DROPOUT)
    s1, s2, stamp = tokens(t=9)
    target = torch.roll(s1, 1, dims=1)
    pos = torch.arange(9)
    with torch.no_grad():
        h = reference_context(model, s1, s2, stamp)
        for training in (False, True):  # dropout 0: the modes differ only in the cross-attention's mask
            model.train(training)
            s1_logits, s2_logits = model(s1, s2, stamp, use_teacher_forcing=True, s1_targets=target)
            torch.testing.assert_close(s1_logits, h @ model.head.proj_s1.weight.T + model.head.proj_s1.bias,
                                       atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(s2_logits, reference_s2(model, h, target, pos, pos, causal=training),
                                       atol=1e-5, rtol=1e-5)


def test_eval_mode_cross_attention_sees_later_positions_training_mode_does_not():
    """Upstream's validation runs in eval mode: each position's s2 logits then read the context of
    later positions, which holds the very tokens being predicted."""
    model = tiny_model(**NO_DROPOUT)
    s1, s2, stamp = tokens(t=10)
    target = torch.roll(s1, -1, dims=1)
    later = [t.clone() for t in (s1, s2)]
    for t in later:
        t[:, 7:] = (t[:, 7:] + 1) % 16  # change only the inputs at positions 7..
    with torch.no_grad():
        for training, leaks in ((True, False), (False, True)):
            model.train(training)
            a1, a2 = model(s1, s2, stamp, use_teacher_forcing=True, s1_targets=target)
            b1, b2 = model(*later, stamp, use_teacher_forcing=True, s1_targets=target)
            assert torch.allclose(a1[:, :7], b1[:, :7], atol=1e-6)  # the s1 branch is causal in both modes
            assert (not torch.allclose(a2[:, :7], b2[:, :7], atol=1e-6)) is leaks
        model.dep_layer.cross_attn.causal = True  # the switch a causal validation uses
        a2 = model(s1, s2, stamp, use_teacher_forcing=True, s1_targets=target)[1]
        b2 = model(*later, stamp, use_teacher_forcing=True, s1_targets=target)[1]
        assert torch.allclose(a2[:, :7], b2[:, :7], atol=1e-6)
        model.train()
        torch.testing.assert_close(model(s1, s2, stamp, use_teacher_forcing=True, s1_targets=target)[1], a2)


def test_without_teacher_forcing_s2_is_conditioned_on_sampled_s1():
    model = tiny_model()
    s1, s2, stamp = tokens()
    with torch.no_grad():
        torch.manual_seed(3)
        s1_logits, s2_logits = model(s1, s2, stamp)
        torch.manual_seed(3)
        drawn = torch.multinomial(F.softmax(s1_logits, -1).view(-1, 16), 1).view(s1.shape)
        again = model(s1, s2, stamp, use_teacher_forcing=True, s1_targets=drawn)[1]
    assert torch.equal(s2_logits, again)
    with pytest.raises(ValueError, match="s1_targets"):
        model(s1, s2, stamp, use_teacher_forcing=True)


def test_one_position_query_gets_the_identity_rotation_the_rope_quirk():
    """upstream sizes the cross-attention's rotary table by the query: with one s1 id every key
    (and the query) gets position 0's rotation; ``cross_rope='positions'`` is the rotation training uses."""
    model = tiny_model(**NO_DROPOUT)
    s1, s2, stamp = tokens(t=8)
    nxt = torch.tensor([[3], [5], [7]])
    with torch.no_grad():
        s1_logits, ctx = model.decode_s1(s1, s2, stamp)
        quirk = model.decode_s2(ctx, nxt)[:, -1]
        zeros = torch.zeros(8, dtype=torch.long)
        torch.testing.assert_close(quirk, reference_s2(model, ctx, nxt, zeros[:1], zeros, causal=False)[:, -1],
                                   atol=1e-5, rtol=1e-5)
        keys = cross_keys(model, ctx, 0, "upstream")
        torch.testing.assert_close(s2_logits_last(model, *keys, ctx[:, -1:], nxt, "upstream"), quirk, atol=1e-6, rtol=0)
        positions = s2_logits_last(model, *cross_keys(model, ctx, 0, "positions"), ctx[:, -1:], nxt, "positions")
        # the training computation's last row: query at position 7, causal over keys 0..7
        model.train()
        trained = model.decode_s2(ctx, torch.cat([s1[:, 1:], nxt], 1))[:, -1]
        model.eval()
    torch.testing.assert_close(positions, trained, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(positions, quirk, atol=1e-4)


def test_key_padding_mask_keeps_attention_off_padded_positions():
    model = tiny_model(**NO_DROPOUT)
    s1, s2, stamp = tokens(b=2, t=8)
    pad = 3
    padded = [torch.cat([torch.zeros_like(t[:, :pad]), t], 1) for t in (s1, s2, stamp)]
    mask = torch.cat([torch.ones(2, pad), torch.zeros(2, 8)], 1)
    with torch.no_grad():
        want = model.decode_s1(s1, s2, stamp)[0]
        got = model.decode_s1(*padded, padding_mask=mask)[0][:, pad:]
        model.train()  # the training path: causal cross-attention with the mask
        logits = model(*padded, padding_mask=mask, use_teacher_forcing=True, s1_targets=padded[0])
        loss, ce1, ce2 = model.head.compute_loss(*logits, padded[0], padded[1], padding_mask=mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # rotary is relative: a shift changes nothing
    manual = F.cross_entropy(logits[0][:, pad:].reshape(-1, 16), s1.reshape(-1))
    torch.testing.assert_close(ce1, manual)
    assert loss == (ce1 + ce2) / 2


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------


def test_top_k_keeps_ties_and_top_p_keeps_the_crossing_token():
    logits = torch.tensor([[3.0, 1.0, 3.0, 0.0, 2.0]])
    kept = top_k_top_p_filtering(logits.clone(), top_k=2)
    assert torch.isfinite(kept).tolist() == [[True, False, True, False, False]]
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = top_k_top_p_filtering(probs.log(), top_p=0.6)  # 0.5 < 0.6: the 0.3 token crosses and stays
    assert torch.isfinite(kept).tolist() == [[True, True, False, False]]
    assert sample_from_logits(torch.tensor([[0.1, 2.0, 0.3]]), top_k=1).item() == 1
    assert sample_from_logits(torch.tensor([[0.1, 2.0, 0.3]]), sample_logits=False).item() == 1


# ---------------------------------------------------------------------------------------------
# The cache against recomputing the window
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cross_rope", ["upstream", "positions"])
def test_cached_logits_equal_recomputing_the_window(cross_rope):
    model = tiny_model()
    s1, s2, stamp = tokens(b=2, t=14, seed=5)
    lookback = 6
    with torch.inference_mode():
        decoder = IncrementalDecoder(model, series=2, repeats=2, lookback=lookback, max_new=8, cross_rope=cross_rope)
        for cur in range(lookback, 14):
            if cur == lookback:
                got1, h = decoder.prefill(s1[:, :cur], s2[:, :cur], stamp[:, :cur])
            else:
                got1, h = decoder.step(*(t[:, cur - 1:cur].repeat_interleave(2, 0) for t in (s1, s2, stamp)))
            want1, ctx = model.decode_s1(s1[:, :cur], s2[:, :cur], stamp[:, :cur])
            nxt = s1[:, cur:cur + 1]
            if cross_rope == "upstream":
                want2 = model.decode_s2(ctx, nxt)[:, -1]
            else:
                want2 = s2_logits_last(model, *cross_keys(model, ctx, 0, cross_rope), ctx[:, -1:], nxt, cross_rope)
            got2 = decoder.s2_logits(h, nxt.repeat_interleave(2, 0))
            torch.testing.assert_close(got1, want1[:, -1].repeat_interleave(2, 0), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got2, want2.repeat_interleave(2, 0), atol=1e-5, rtol=1e-5)


def _inputs(series=3, lookback=12, pred_len=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(series, lookback, 6, generator=gen), stamps(series, lookback, gen), stamps(series, pred_len, gen))


@pytest.mark.parametrize("lookback,pred_len,max_context", [(12, 6, 512), (12, 6, 18), (12, 6, 14), (12, 6, 9)])
def test_cached_forecast_equals_upstreams_recomputing_loop(lookback, pred_len, max_context):
    """Greedy paths are identical; sampled ones too from one seed (the draws come in upstream's order)."""
    model, tokenizer = tiny_model(), tiny_tokenizer()
    args = (tokenizer, model, *_inputs(3, lookback, pred_len), max_context, pred_len)
    for sampling in ({"top_k": 1}, {"T": 0.8, "top_p": 0.9}, {"top_k": 4}):
        paths = []
        for use_cache in (True, False):
            torch.manual_seed(11)
            paths.append(generate_tokens(*args, sample_count=4, use_cache=use_cache, **sampling))
        assert torch.equal(paths[0][0], paths[1][0]) and torch.equal(paths[0][1], paths[1][1]), sampling
    torch.manual_seed(0)
    a = auto_regressive_inference(*args, top_k=1, sample_count=2)
    torch.manual_seed(99)
    b = auto_regressive_inference(*args, top_k=1, sample_count=2, use_cache=False)
    assert a.shape == (3, min(lookback + pred_len, max_context), 6) and np.array_equal(a, b)


def test_the_cache_never_rolls_while_the_window_fits(monkeypatch):
    model, tokenizer = tiny_model(), tiny_tokenizer()
    calls = {"decode_s1": 0, "prefill_rows": [], "steps": 0}
    monkeypatch.setattr(model, "decode_s1", lambda *a, **k: calls.__setitem__("decode_s1", calls["decode_s1"] + 1)
                        or Kronos.decode_s1(model, *a, **k))
    prefill, step = IncrementalDecoder.prefill, IncrementalDecoder.step
    monkeypatch.setattr(IncrementalDecoder, "prefill",
                        lambda self, s1, *a: calls["prefill_rows"].append(s1.shape[0]) or prefill(self, s1, *a))
    monkeypatch.setattr(IncrementalDecoder, "step",
                        lambda self, *a, **k: calls.__setitem__("steps", calls["steps"] + 1) or step(self, *a, **k))
    s1, _ = generate_tokens(tokenizer, model, *_inputs(3, 12, 6), 18, 6, sample_count=5, top_k=1)
    assert s1.shape == (15, 18)
    assert calls == {"decode_s1": 0, "prefill_rows": [3], "steps": 5}  # 3 series prefilled once for 15 paths
    generate_tokens(tokenizer, model, *_inputs(3, 12, 6), 15, 6, sample_count=5, top_k=1)
    assert calls["decode_s1"] == 2 and calls["steps"] == 5 + 3  # prefill at 12, steps at 13..15; 16 and 17 roll


# ---------------------------------------------------------------------------------------------
# KronosPredictor
# ---------------------------------------------------------------------------------------------


def _frame(n=40, seed=0, volume=True, amount=True):
    rng = np.random.default_rng(seed)
    close = 50 + rng.standard_normal(n).cumsum()
    df = pd.DataFrame({"open": close + rng.normal(0, 0.2, n), "high": close + 1.0, "low": close - 1.0, "close": close})
    if volume:
        df["volume"] = rng.uniform(1e3, 5e3, n)
    if amount:
        df["amount"] = df["volume"] * close if volume else rng.uniform(1e5, 5e5, n)
    return df


def _times(n=40, pred_len=5):
    ts = pd.Series(pd.date_range("2024-03-01 09:30", periods=n + pred_len, freq="15min"))
    return ts[:n].reset_index(drop=True), ts[n:].reset_index(drop=True)


def test_predict_normalises_forecasts_and_maps_back_as_the_spec_says():
    predictor = KronosPredictor(tiny_model(), tiny_tokenizer(), device="cpu", max_context=512)
    df, (xt, yt) = _frame(), _times()
    torch.manual_seed(0)
    out = predictor.predict(df, xt, yt, pred_len=5, top_k=1, verbose=False)
    assert list(out.columns) == ["open", "high", "low", "close", "volume", "amount"]
    assert out.shape == (5, 6) and list(out.index) == list(yt)
    x = df.to_numpy(dtype=np.float32)
    mean, std = x.mean(0), x.std(0)
    z = np.clip((x - mean) / (std + 1e-5), -5, 5)
    stamp = lambda t: np.stack([t.dt.minute, t.dt.hour, t.dt.weekday, t.dt.day, t.dt.month], -1)[None]  # noqa: E731
    torch.manual_seed(0)
    ref = auto_regressive_inference(predictor.tokenizer, predictor.model, torch.tensor(z[None]),
                                    torch.tensor(stamp(xt), dtype=torch.float32),
                                    torch.tensor(stamp(yt), dtype=torch.float32), 512, 5, top_k=1, sample_count=1)
    np.testing.assert_allclose(out.to_numpy(), ref[0, -5:] * (std + 1e-5) + mean, rtol=1e-6)
    batch = predictor.predict_batch([df, df * 2], [xt, xt], [yt, yt], pred_len=5, top_k=1, verbose=False)
    pd.testing.assert_frame_equal(batch[0], out)
    paths = predictor.predict_paths([df], [xt], [yt], pred_len=5, top_k=1, sample_count=3)
    assert paths[0].shape == (3, 5, 6)
    np.testing.assert_allclose(paths[0].mean(0), out.to_numpy(), rtol=1e-5)


def test_missing_volume_and_amount_follow_upstreams_rules():
    predictor = KronosPredictor(tiny_model(), tiny_tokenizer(), device="cpu")
    xt, yt = _times()
    base = _frame()

    def forecast(df):
        torch.manual_seed(0)
        return predictor.predict(df, xt, yt, 5, top_k=1, verbose=False)

    no_volume = forecast(base.drop(columns=["volume", "amount"]))
    pd.testing.assert_frame_equal(no_volume, forecast(base.assign(volume=0.0, amount=0.0)))
    filled = base.assign(amount=base["volume"] * base[["open", "high", "low", "close"]].mean(axis=1))
    pd.testing.assert_frame_equal(forecast(base.drop(columns=["amount"])), forecast(filled))


def test_forecasting_runs_in_eval_mode_and_restores_the_callers_mode():
    model, tokenizer = tiny_model().train(), tiny_tokenizer()
    model.dep_layer.eval()  # a mixed state, restored module by module
    df, (xt, yt) = _frame(), _times()
    torch.manual_seed(0)
    got = KronosPredictor(model, tokenizer, device="cpu").predict(df, xt, yt, 5, top_k=1, verbose=False)
    assert model.training and not model.dep_layer.training and model.transformer[0].training
    reference = tiny_model()  # the same weights, already in eval mode
    torch.manual_seed(0)
    want = KronosPredictor(reference, tiny_tokenizer(), device="cpu").predict(df, xt, yt, 5, top_k=1, verbose=False)
    pd.testing.assert_frame_equal(got, want)
    torch.manual_seed(0)
    as_given = KronosPredictor(model, tokenizer, device="cpu", eval_mode=False).predict(df, xt, yt, 5, top_k=1,
                                                                                         verbose=False)
    assert not np.allclose(as_given.to_numpy(), want.to_numpy())  # upstream's behaviour: dropout on


def _bad_nan(df):
    df.loc[7, "high"] = np.nan
    return df


def _repeat_third(xt):
    xt = xt.copy()
    xt[3] = xt[2]
    return xt


PREDICT_ERRORS = {
    "NaN": (lambda df, xt, yt: (_bad_nan(df), xt, yt, 5), DataError, "'high'"),
    "duplicate column": (lambda df, xt, yt: (pd.concat([df, df[["close"]]], axis=1), xt, yt, 5), DataError,
                         "'close' more than once"),
    "capitalised column": (lambda df, xt, yt: (df.rename(columns={"close": "Close"}), xt, yt, 5), DataError,
                           "it has 'Close'"),
    "text column": (lambda df, xt, yt: (df.assign(close=df["close"].astype(str)), xt, yt, 5), DataError,
                    "pd.to_numeric(df['close'])"),
    "boolean column": (lambda df, xt, yt: (df.assign(volume=df["volume"] > 2000), xt, yt, 5), DataError, "booleans"),
    "nullable NA": (lambda df, xt, yt: (df.assign(volume=pd.array([1.0] * 39 + [None], dtype="Float64")), xt, yt, 5),
                    DataError, "'volume' holds 1 NaN"),
    "beyond float32": (lambda df, xt, yt: (df.assign(amount=1e39), xt, yt, 5), DataError, "'amount'"),
    "spread overflows": (lambda df, xt, yt: (df.assign(amount=np.linspace(-3e38, 3e38, 40)), xt, yt, 5), DataError,
                         "too far apart"),
    "one row": (lambda df, xt, yt: (df[:1], xt[:1], yt, 5), DataError, "at least 2 bars"),
    "unsorted x_timestamp": (lambda df, xt, yt: (df, xt[::-1].reset_index(drop=True), yt, 5), DataError,
                             "increasing order"),
    "repeated x_timestamp": (lambda df, xt, yt: (df, _repeat_third(xt), yt, 5), DataError, "repeats"),
    "y_timestamp inside the lookback": (lambda df, xt, yt: (df, xt, xt[-5:].reset_index(drop=True), 5), DataError,
                                        "not after x_timestamp's last bar"),
    "epoch numbers as timestamps": (lambda df, xt, yt: (df, pd.Series(np.arange(40) * 900), yt, 5), DataError,
                                    "holds numbers"),
    "text timestamps": (lambda df, xt, yt: (df, pd.Series(["09:30"] * 40), yt, 5), DataError, "'09:30'"),
    "x_timestamp not a sequence": (lambda df, xt, yt: (df, 1704067200, yt, 5), DataError, "is a int"),
    "zone on one side": (lambda df, xt, yt: (df, xt.dt.tz_localize("Asia/Shanghai"), yt, 5), DataError,
                         "time zone Asia/Shanghai"),
    "pred_len beyond max_context": (lambda df, xt, yt: (df, xt, _times(40, 513)[1], 513), ConfigError,
                                    "pred_len 513 is beyond max_context 512"),
    "inf": (lambda df, xt, yt: (df.assign(volume=np.inf), xt, yt, 5), DataError, "'volume'"),
    "no close": (lambda df, xt, yt: (df.drop(columns=["close"]), xt, yt, 5), DataError, "'close'"),
    "short x_timestamp": (lambda df, xt, yt: (df, xt[:-1], yt, 5), DataError, "x_timestamp"),
    "y_timestamp vs pred_len": (lambda df, xt, yt: (df, xt, yt, 4), DataError, "pred_len"),
    "pred_len 0": (lambda df, xt, yt: (df, xt, yt[:0], 0), ConfigError, "pred_len"),
    "not a frame": (lambda df, xt, yt: (df.to_numpy(), xt, yt, 5), DataError, "DataFrame"),
}


@pytest.mark.parametrize("case", sorted(PREDICT_ERRORS))
def test_bad_input_is_one_line_naming_it(case):
    make, kind, needle = PREDICT_ERRORS[case]
    predictor = KronosPredictor(tiny_model(), tiny_tokenizer(), device="cpu")
    with pytest.raises(kind) as info:
        predictor.predict(*make(_frame(), *_times()), verbose=False)
    assert isinstance(info.value, ValueError) and needle in str(info.value) and "\n" not in str(info.value)


def test_mismatched_tokenizer_and_batch_lengths_are_refused():
    with pytest.raises(ConfigError, match="s1_bits"):
        KronosPredictor(tiny_model(s1_bits=5), tiny_tokenizer(), device="cpu")
    predictor = KronosPredictor(tiny_model(), tiny_tokenizer(), device="cpu")
    xt, yt = _times()
    with pytest.raises(DataError, match="one length"):
        predictor.predict_batch([_frame(), _frame(30)], [xt, xt[:30]], [yt, yt], 5, verbose=False)
    with pytest.raises(DataError, match=r"df_list\[1\] column 'low'"):
        predictor.predict_batch([_frame(), _frame().assign(low=np.nan)], [xt, xt], [yt, yt], 5, verbose=False)


SAMPLING_ERRORS = {
    "T below the range": ({"T": 1e-40}, ConfigError, "T is 1e-40"),  # logits / T overflowed: a RuntimeError before
    "T above the range": ({"T": 1e7}, ConfigError, "T is 10000000.0"),
    "T nan": ({"T": float("nan")}, ConfigError, "T is nan"),
    "top_p 0": ({"top_p": 0.0}, ConfigError, "top_p is 0.0"),
    "top_k negative": ({"top_k": -1}, ConfigError, "top_k is -1"),
    "top_k fractional": ({"top_k": 2.5}, ConfigError, "top_k is 2.5"),
    "sample_count 0": ({"sample_count": 0}, ConfigError, "sample_count is 0"),
    "sample_count beyond memory": ({"sample_count": 10**12}, MemoryBudgetError, "sample_count 1000000000000"),
}


@pytest.mark.parametrize("case", sorted(SAMPLING_ERRORS))
def test_bad_sampling_settings_are_one_line_naming_them(case):
    kwargs, kind, needle = SAMPLING_ERRORS[case]
    predictor = KronosPredictor(tiny_model(), tiny_tokenizer(), device="cpu")
    df, (xt, yt) = _frame(), _times()
    for call in (lambda: predictor.predict(df, xt, yt, 5, verbose=False, **kwargs),
                 lambda: predictor.predict_paths([df], [xt], [yt], 5, **kwargs)):
        with pytest.raises(kind) as info:
            call()
        assert isinstance(info.value, ValueError) and needle in str(info.value) and "\n" not in str(info.value)


def test_numpy_scalars_are_the_same_settings():
    predictor = KronosPredictor(tiny_model(), tiny_tokenizer(), device=np.str_("cpu"), max_context=np.int64(512),
                                clip=np.float32(5))
    df, (xt, yt) = _frame(), _times()
    torch.manual_seed(3)
    a = predictor.predict(df, xt, yt, np.int64(5), T=np.float32(0.75), top_p=np.float64(0.9),
                          sample_count=np.int32(2), verbose=False)
    torch.manual_seed(3)
    b = predictor.predict(df, xt, yt, 5, T=float(np.float32(0.75)), top_p=0.9, sample_count=2, verbose=False)
    pd.testing.assert_frame_equal(a, b)


CONSTRUCTOR_ERRORS = {
    "hub id as model": (lambda m, t: ("NeoQuasar/Kronos-small", t), {}, ArgumentTypeError,
                        "Kronos.from_pretrained('NeoQuasar/Kronos-small')"),
    "path as tokenizer": (lambda m, t: (m, os.path.join("models", "Kronos-Tokenizer-base")), {}, ArgumentTypeError,
                          "KronosTokenizer.from_pretrained('models/Kronos-Tokenizer-base')"),
    "swapped": (lambda m, t: (t, m), {}, ArgumentTypeError, "swapped"),
    "not a model": (lambda m, t: ({"d_model": 32}, t), {}, ArgumentTypeError, "builtins.dict"),
    "half weights": (lambda m, t: (m.half(), t), {}, ArgumentTypeError, "float16 weights"),
    "cuda:7": (lambda m, t: (m, t), {"device": "cuda:7"}, ConfigError, "'cuda:7'"),
    "tpu": (lambda m, t: (m, t), {"device": "tpu"}, ConfigError, "'tpu' is not a device"),
    "meta": (lambda m, t: (m, t), {"device": "meta"}, ConfigError, "not meta"),
    "max_context text": (lambda m, t: (m, t), {"max_context": "512"}, ConfigError, "max_context is '512'"),
    "clip 0": (lambda m, t: (m, t), {"clip": 0}, ConfigError, "clip is 0"),
    "cross_rope": (lambda m, t: (m, t), {"cross_rope": "sideways"}, ConfigError, "'sideways'"),
}


@pytest.mark.parametrize("case", sorted(CONSTRUCTOR_ERRORS))
def test_bad_models_and_settings_are_refused_by_name(case):
    make, kwargs, kind, needle = CONSTRUCTOR_ERRORS[case]
    if case == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    with pytest.raises(kind) as info:
        KronosPredictor(*make(tiny_model(), tiny_tokenizer()), **kwargs)
    assert needle in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert isinstance(info.value, TypeError if kind is ArgumentTypeError else ValueError)


def test_the_array_level_loop_refuses_what_it_cannot_read():
    model, tokenizer = tiny_model(), tiny_tokenizer()
    x, xs, ys = _inputs(2, 12, 4)
    cases = [((x.numpy(), xs, ys, 512, 4), ArgumentTypeError, "torch.from_numpy"),
             ((x.double(), xs, ys, 512, 4), ArgumentTypeError, "float64 tensor"),
             ((x[..., :5], xs, ys, 512, 4), DataError, "reads 6 features"),
             ((x, xs[:, :-1], ys, 512, 4), DataError, "x_stamp of shape (2, 11, 5)"),
             ((x, xs, ys, 512, 3), DataError, "y_stamp of shape (2, 4, 5)"),
             ((x, xs, ys.index_fill(2, torch.tensor([1]), 24.0), 512, 4), DataError, "hour 24"),
             ((x, xs.index_fill(2, torch.tensor([0]), 0.5), ys, 512, 4), DataError, "minute 0.5"),
             ((x.index_fill(1, torch.tensor([3]), float("nan")), xs, ys, 512, 4), DataError, "NaN"),
             ((x, xs, ys, 3, 4), ConfigError, "beyond max_context 3")]
    for args, kind, needle in cases:
        with pytest.raises(kind) as info:
            generate_tokens(tokenizer, model, *args, top_k=1)
        assert needle in str(info.value), (needle, str(info.value))
        with pytest.raises(kind):
            auto_regressive_inference(tokenizer, model, *args, top_k=1)


def test_a_lookback_beyond_max_context_keeps_upstreams_numbers_and_warns_once_naming_the_lengths():
    predictor = KronosPredictor(tiny_model(), tiny_tokenizer(), device="cpu", max_context=16)
    df, (xt, yt) = _frame(30), _times(30, 5)
    with pytest.warns(ForecastWarning) as caught:
        torch.manual_seed(0)
        got = predictor.predict_batch([df, df * 1.5], [xt, xt], [yt, yt], 5, top_k=1, verbose=False)
    assert len(caught) == 1, [str(w.message) for w in caught]  # one batch, one warning
    message = str(caught[0].message)
    assert "30 bars" in message and "max_context is 16" in message and caught[0].filename == __file__
    x = df.to_numpy(dtype=np.float32)
    mean, std = x.mean(0), x.std(0)
    z = np.clip((x - mean) / (std + 1e-5), -5, 5)
    stamp = lambda t: np.stack([t.dt.minute, t.dt.hour, t.dt.day_of_week, t.dt.day, t.dt.month], -1)[None]  # noqa: E731
    torch.manual_seed(0)
    with pytest.warns(ForecastWarning):
        ref = auto_regressive_inference(predictor.tokenizer, predictor.model, torch.tensor(z[None]),
                                        torch.tensor(stamp(xt), dtype=torch.float32),
                                        torch.tensor(stamp(yt), dtype=torch.float32), 16, 5, top_k=1, sample_count=1,
                                        use_cache=False)
    np.testing.assert_allclose(got[0].to_numpy(), ref[0, -5:] * (std + 1e-5) + mean, rtol=1e-6)
    assert got[0].shape == (5, 6) and list(got[0].index) == list(yt)


def test_the_memory_estimate_refuses_before_anything_is_allocated(monkeypatch):
    """With little memory free, a forecast that needs more is refused, naming both sizes; the
    estimate grows with the paths and is above the token paths alone."""
    from kronos_mlflow.model import forecast

    model, tokenizer = tiny_model(), tiny_tokenizer()
    small = forecast.forecast_bytes(model, tokenizer, 2, 40, 5, 4, 512)
    large = forecast.forecast_bytes(model, tokenizer, 2, 40, 5, 400, 512)
    assert 2 * 45 * 4 * 16 < small < large and large >= 90 * small
    monkeypatch.setattr(forecast, "available_bytes", lambda device: small * 10)
    predictor = KronosPredictor(model, tokenizer, device="cpu")
    df, (xt, yt) = _frame(), _times()
    monkeypatch.setattr(forecast.IncrementalDecoder, "__init__", lambda *a, **k: pytest.fail("allocated"))
    with pytest.raises(MemoryBudgetError) as info:
        predictor.predict_paths([df, df], [xt, xt], [yt, yt], 5, sample_count=400)
    assert "sample_count 400 for 2 series (800 paths of 40 + 5 bars)" in str(info.value)
    fit = int(str(info.value).split("a sample_count of ")[1].split()[0])
    assert forecast.forecast_bytes(model, tokenizer, 2, 40, 5, fit, 512) <= small * 10
    assert forecast.forecast_bytes(model, tokenizer, 2, 40, 5, fit + 1, 512) > small * 10
