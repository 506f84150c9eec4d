"""Mutants that compute the same thing for every input the code can receive (name -> why), read
by scripts/mutation_report.py. A reason names the fact that makes the change invisible."""

from __future__ import annotations

# Mutants that compute the same thing for every input (name -> why).
EQUIVALENT: dict[str, str] = {
    "ie_core.ragged.x__pad__mutmut_12": "slice(None, n) is slice(0, n)",
    "ie_core.ragged.x__pad__mutmut_14": "slice(n) is slice(0, n)",
    "ie_core.ragged.x_capture_ragged_async__mutmut_36": "the placeholder is overwritten",
    "ie_core.ragged.x_capture_ragged_async__mutmut_39": "order and caches always match in length",
    "ie_core.ragged.x_capture_ragged_async__mutmut_42": "order and caches always match in length",
    "ie_core.ragged.x_capture_ragged_async__mutmut_43": "order and caches always match in length",
    "ie_core.sae_math.x_activate__mutmut_23": "torch.topk's default dim is -1",
    "ie_core.sae_math.x_topk_features__mutmut_7": "torch.topk's default dim is -1",
    "ie_core.sae_math.x_normalized__mutmut_18": "std is shift-invariant: std(x + mu) = std(x - mu)",
    "ie_core.sae_math.xǁDictMetaǁfrom_dict__mutmut_22": "bool(None) is bool(False)",
    "ie_core.sae_math.xǁDictMetaǁfrom_dict__mutmut_24": "bool(None) is bool(False)",
    "ie_core.steer_math.x_unit_vector__mutmut_12": "peak is never 0: as_vector refuses zero vectors",
    "ie_core.steer_math.x_head_columns__mutmut_1": "Patch and Scale refuse heads without head_dim",
    "ie_core.spec_values.x__real_dtype__mutmut_7": "str(None) names no complex or bool dtype",
    "ie_core.spec_values.x__real_dtype__mutmut_10": "str(None) names no complex or bool dtype",
    "ie_core.spec_values.x__real_dtype__mutmut_13": "'' and 'XXXX' name no complex or bool dtype",
    **{
        f"ie_core.spec_values.x_as_row__mutmut_{n}": "a tensor's tolist() is its detach().tolist()"
        for n in (37, 41, 42)
    },
    **{
        f"ie_core.steer_math.x_check_ops_fit__mutmut_{n}": "typing.cast ignores its type at run time"
        for n in (9, 13, 14)
    },
    "ie_core.wire.x_sampling_to_wire__mutmut_9": "asdict always holds the key: pop never misses",
    "ie_vllm.worker.layout.x_record_layout__mutmut_6": "only entries up to num_reqs are read",
    **{
        f"ie_static.ops.x_{f}__mutmut_{n}": "the tap's rows are [n, D] and its masks [n]: dim +1 is dim -1"
        for f, ns in (("_patch_rows", (6, 14, 17)), ("steer_rows", (53, 73, 94, 110, 115, 126)))
        for n in ns
    },
    **{
        f"ie_static.ops.x_steer_rows__mutmut_{n}": "positions lie in [0, P), P = max_model_len"
        for n in (12, 13, 15, 17)
    },
    "ie_vllm.worker.layout.x_record_layout__mutmut_38": "query_start_loc[0] is 0: no requests, 0 tokens",
    "ie_static.taps.x__tapped_forward__mutmut_3": "typing.cast ignores its type at run time",
    # ie-eager's resolver. A Resolved's kind and a Tap's io are checked when they are built (a
    # wrong one raises), a tap's path appears only in the message for a module that produced no
    # tensor, a path address is never written (steering specs name registry points only), and a
    # Resolved's writable is read only as a truth value (`not r.writable`, `all(writes)`).
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_{n}": "a tap's path is read only by the "
        "message for a module that produced no tensor"
        for f, n in (
            ("embeddings", 14),
            ("final_norm", 21),
            ("lm_head", 14),
            ("path", 17),
            ("multi_stream", 138),
        )
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_path__mutmut_{n}": "a path address is never written: "
        "steering specs name registry points only"
        for n in (9, 25)
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_{n}": "writable is read only as a truth value: "
        "None is False"
        for f, n in (("lm_head", 6), ("attention", 11), ("multi_stream", 33), ("gate", 38))
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_gate__mutmut_{n}": "q_proj's per-head group is 2 x "
        "head_dim wide: a slice to None or past the end stops there"
        for n in (25, 32)
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_{n}": "a Tap's io defaults to 'out'"
        for f, ns in (
            ("attention", (24,)),
            ("embeddings", (19,)),
            ("final_norm", (26,)),
            ("lm_head", (19,)),
            ("path", (22,)),
            ("mla_value", (29,)),
            ("multi_stream", (47,)),
            ("mlp_branch", (10, 18)),
            ("gate", (52,)),
            ("mlp_in", (7,)),
            ("mlp_out", (11, 23)),
            ("attn_out", (6, 18)),
            ("post", (27,)),
            ("value", (191,)),
            ("mlp_inner", (127, 158, 190)),
            ("router", (58, 91)),
            ("value", (31,)),
        )
        for n in ns
    },
    "ie_eager.resolve.xǁResolverǁ_mlp_inner__mutmut_108": "gate_up_proj is 2 x d_mlp wide: a "
    "slice to 3 x d_mlp stops at its end, in get and put alike",
    "ie_eager.resolve.xǁResolverǁ_mla_value__mutmut_6": "kv_b_proj's per-head group is "
    "nope + v_dim wide, so the slice to None ends at nope + v_dim",
    **{
        f"ie_eager.resolve.xǁResolverǁ_router_order__mutmut_{n}": "the order memo is per "
        "resolver (one model), whose routers are all one class: any fixed key is one entry"
        for n in (8, 9)
    },
    "ie_eager.resolve.xǁResolverǁ_router_order__mutmut_11": "flipped = None is falsy like False",
    **{
        f"ie_eager.resolve.xǁResolverǁ_router_order__mutmut_{n}": "a router's output items are "
        "2-D [tokens, experts or k]: axis 1 is the last, and the probe's token count leaves it"
        for n in (23, 24)
    },
    "ie_eager.resolve.xǁResolverǁpoint_names__mutmut_11": "a hyper-connection trunk has at least "
    "2 streams (DeepSeek-V4: 4), so stream 1 resolves wherever stream 0 does",
    "ie_eager.resolve.xǁResolverǁ_mlp_branch__mutmut_21": "_mlp_branch runs only on blocks "
    "with both MLPs: neither tap is ever None",
    **{
        f"ie_eager.resolve.xǁResolverǁ_single_stream__mutmut_{n}": "never called: _resolve "
        "refuses multi-stream points on a single trunk and _multi_stream serves them on a "
        "multi-stream one"
        for n in range(1, 7)
    },
    **{
        f"ie_eager.hooks.xǁSessionǁ_rows__mutmut_{n}": "torch.tensor of Python bools is torch.bool"
        for n in (16, 19)
    },
    "ie_eager.hooks.xǁSessionǁ_write__mutmut_75": "steered already has raw's dtype (apply_ops, "
    "the selectors and the scale keep it), so .to(None) and .to(raw.dtype) are both no-ops",
    **{
        f"ie_static.tables.xǁWriteTableǁ_fill_affine__mutmut_{n}": "a Patch has one row or one per "
        "position, and one row broadcasts on assignment to the rows either way"
        for n in (46, 47, 48)
    },
    **{
        f"ie_core.wire.x_steering_from_wire__mutmut_{n}": "bool(None) is bool(False)"
        for n in (77, 79, 85, 87, 93, 95)
    },
    # ie-eager, the last open mutants of the full run (4 December), read one by one.
    **{
        f"ie_eager.hooks.x__remember_order__mutmut_{n}": "the remembered base's module carries no "
        "other point's write (the block input: resid_pre's only; Granite's routed MLP: none) and "
        "path addresses are read-only, so before or after the rest of the site the same tensor "
        "is remembered"
        for n in (1, 2, 3, 4, 5)
    },
    **{
        f"ie_eager.hooks.xǁSessionǁ_install__mutmut_{n}": "the index only breaks ties between "
        "actions of one point and phase, and the sort is stable: insertion order is the index's"
        for n in (22, 69)
    },
    **{
        f"ie_eager.hooks.xǁSessionǁ_install__mutmut_{n}": "_run reads every action that is "
        "neither 'remember' nor 'write'"
        for n in (62, 74, 75)
    },
    "ie_eager.hooks.xǁSessionǁ_install__mutmut_73": "a read's phase has only to follow its "
    "point's writes (phase 0); the remember action it can tie with changes nothing",
    "ie_eager.hooks.xǁSessionǁ_out_hook__mutmut_9": "a forward hook that returns the output "
    "object itself leaves the output as it was",
    "ie_eager.hooks.xǁSessionǁ_install_attention__mutmut_36": "every attention module of the "
    "families with softmax attention returns a tuple (measured on all 29)",
    "ie_eager.hooks.xǁSessionǁ_install_attention__mutmut_37": "item 1 of every family's attention "
    "output is its weights, in the output's dtype (measured on all 29 in bfloat16)",
    "ie_eager.resolve.xǁResolverǁ_head_layout__mutmut_6": "any probe length other than heads "
    "tells [b, s, heads, hd] from [b, heads, s, hd]",
    "ie_eager.resolve.xǁResolverǁ_head_layout__mutmut_12": "a 3-d output [b, n, heads x hd] has "
    "shape[2] == n = heads + 3 only if heads x head_dim == heads + 3 (1 x 4, 3 x 2); no "
    "attention is that small",
    "ie_eager.resolve.xǁResolverǁ_head_layout__mutmut_20": "a tap's path is read only by the "
    "message for a module that produced no tensor",
    "ie_eager.resolve.xǁResolverǁ_mlp_out_point__mutmut_4": "post is read only as a truth value: "
    "None is False",
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_14": "reached only when the family lacks the "
        "point, so _missing gives the family's reason and never reads this fallback"
        for f in ("router", "mlp_inner")
    },
    "ie_eager.resolve.xǁResolverǁ_router__mutmut_77": "writable is read only as a truth value: "
    "None is False",
    "ie_eager.resolve.xǁResolverǁ_resid_mid__mutmut_12": "resid_mid keeps only _post's tap and "
    "scale; the address _post is given is not read",
    **{
        f"ie_eager.resolve.xǁResolverǁ_{f}__mutmut_4": "a block's own tap always exists, so the "
        "fallback reason is never read"
        for f in ("resid_pre", "resid_post")
    },
    **{
        f"ie_eager.resolve.xǁResolverǁ_value__mutmut_{n}": "the fused projection's name is "
        "'<attention child>.<projection>', one dot: each split keeps the projection's name "
        "last (and at index 1)"
        for n in (105, 106, 109, 110)
    },
    "ie_eager.resolve.xǁResolverǁ_value__mutmut_118": "getattr's default is read only as a truth "
    "value: None is False",
}
