#!/usr/bin/env python3
"""Writes pre-quantised FP8 checkpoints, in the Hugging Face layouts people publish, from a float32 checkpoint, and
beside each one a float32 checkpoint of its dequantised weights (code x scale, computed here): the tests load both
and compare (tests/model/loader/test_fp8_checkpoint.cpp, tests/kernels/cuda/test_runner_fp8_checkpoint.cpp).

    python3 tools/make_fp8_checkpoints.py SRC OUT [--layouts a,b,...]
    python3 tools/make_fp8_checkpoints.py --random-llama SRC      # a seeded random float32 Llama (head_dim 64)

For each layout L: OUT/L (config.json with its quantization_config, model.safetensors with F8_E4M3 weights and
their scales, SRC's other files) and OUT/L-ref (the dequantised float32 weights, no quantization_config). Every 2-D
weight under model.layers is quantised but norms and the layers a layout leaves out (its ignore list); embeddings,
norms and the LM head keep their dtype. Pure python3 (struct, json): e4m3 rounding to nearest, ties to even,
written here independently of the C++ code.
"""
import argparse
import json
import math
import os
import random
import shutil
import struct
import sys
from array import array
from bisect import bisect_left

FP8_MAX = 448.0

# The 127 non-negative finite e4m3 values (OCP "e4m3fn": bias 7, 3 mantissa bits), by code 0x00..0x7e.
E4M3_VALUES = [(m / 8.0) * 2.0 ** -6 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)
               for e in range(16) for m in range(8)][:127]


def e4m3_code(x):
    """The e4m3 code nearest to x (ties to the even code), saturated to +-448."""
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a >= FP8_MAX:
        return sign | 0x7e
    hi = bisect_left(E4M3_VALUES, a)
    if E4M3_VALUES[hi] == a:
        return sign | hi
    lo = hi - 1
    below, above = a - E4M3_VALUES[lo], E4M3_VALUES[hi] - a
    code = lo if below < above else hi if above < below else (lo if lo % 2 == 0 else hi)
    return sign | code


def e4m3_value(code):
    v = E4M3_VALUES[code & 0x7f]
    return -v if code & 0x80 else v


def f32(x):
    """x rounded to float32."""
    return struct.unpack('<f', struct.pack('<f', x))[0]


def bf16(x):
    """x (a float32) rounded to bfloat16, nearest even, as a float."""
    bits = struct.unpack('<I', struct.pack('<f', x))[0]
    bits = (bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff0000
    return struct.unpack('<f', struct.pack('<I', bits))[0]


def bf16_bytes(values):
    out = bytearray()
    for v in values:
        out += struct.pack('<I', struct.unpack('<I', struct.pack('<f', v))[0])[2:]
    return bytes(out)


# ---- safetensors ------------------------------------------------------------------------------------------------

def read_safetensors(path):
    """{name: (shape, float values)} of a float32 file."""
    with open(path, 'rb') as f:
        data = f.read()
    n = struct.unpack('<Q', data[:8])[0]
    header = json.loads(data[8:8 + n])
    tensors = {}
    for name, e in header.items():
        if name == '__metadata__':
            continue
        if e['dtype'] != 'F32':
            sys.exit(f'{path}: {name} is {e["dtype"]}; this script reads float32 checkpoints')
        begin, end = e['data_offsets']
        values = array('f')
        values.frombytes(data[8 + n + begin:8 + n + end])
        tensors[name] = (e['shape'], values)
    return tensors


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)}."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, blob = tensors[name]
        header[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b' ' * (-len(text) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(text)) + text)
        for blob in blobs:
            f.write(blob)


# ---- layouts ----------------------------------------------------------------------------------------------------

# name: (quantization_config, scale layout, block [rows, cols], scale dtype, scale tensor suffix, input_scale, left out)
LAYOUTS = {
    # vLLM / AutoFP8: a float32 scale per tensor, dynamic activations.
    'fp8-tensor': ({'quant_method': 'fp8', 'activation_scheme': 'dynamic'},
                   'tensor', None, 'F32', 'weight_scale', False, []),
    # AutoFP8 static: an input_scale per layer as well.
    'fp8-tensor-static': ({'quant_method': 'fp8', 'activation_scheme': 'static', 'ignored_layers': ['lm_head']},
                          'tensor', None, 'F32', 'weight_scale', True, []),
    # transformers' FineGrainedFP8 (Qwen3-*-FP8, DeepSeek-V3): 128 x 128 blocks, float32 weight_scale_inv.
    'fp8-block': ({'quant_method': 'fp8', 'activation_scheme': 'dynamic', 'fmt': 'e4m3',
                   'weight_block_size': [128, 128]}, 'block', [128, 128], 'F32', 'weight_scale_inv', False, []),
    # The same with small blocks and bfloat16 scales (as Qwen3.5's), a layer left out.
    'fp8-block-small': ({'quant_method': 'fp8', 'activation_scheme': 'dynamic', 'weight_block_size': [16, 32],
                         'modules_to_not_convert': ['lm_head', 'model.layers.1.self_attn.o_proj']},
                        'block', [16, 32], 'BF16', 'weight_scale_inv', False, ['model.layers.1.self_attn.o_proj']),
    # llm-compressor FP8_DYNAMIC: a bfloat16 scale per output channel [out, 1], activations per token, dynamic.
    'ct-channel': ('compressed-tensors', 'channel', None, 'BF16', 'weight_scale', False,
                   ['model.layers.0.mlp.down_proj']),
    # llm-compressor FP8 (static): a scale per tensor [1], input_scale [1].
    'ct-tensor-static': ('compressed-tensors', 'tensor', None, 'F32', 'weight_scale', True, []),
    # llm-compressor FP8_BLOCK: 128 x 128 blocks, activations per token in groups of 128.
    'ct-block': ('compressed-tensors', 'block', [128, 128], 'F32', 'weight_scale', False, []),
}


def compressed_tensors_config(layout, block, static, left_out):
    weights = {'num_bits': 8, 'type': 'float', 'symmetric': True, 'strategy': layout, 'dynamic': False,
               'group_size': None, 'block_structure': block, 'actorder': None, 'observer': 'minmax',
               'observer_kwargs': {}}
    if static:
        acts = {'num_bits': 8, 'type': 'float', 'symmetric': True, 'strategy': 'tensor', 'dynamic': False,
                'observer': 'minmax'}
    elif layout == 'block':
        acts = {'num_bits': 8, 'type': 'float', 'symmetric': True, 'strategy': 'group', 'group_size': 128,
                'dynamic': True, 'observer': None}
    else:
        acts = {'num_bits': 8, 'type': 'float', 'symmetric': True, 'strategy': 'token', 'dynamic': True,
                'observer': None}
    return {'quant_method': 'compressed-tensors', 'format': 'float-quantized', 'quantization_status': 'compressed',
            'config_groups': {'group_0': {'targets': ['Linear'], 'weights': weights, 'input_activations': acts,
                                          'output_activations': None, 'format': 'float-quantized'}},
            'ignore': ['lm_head'] + left_out, 'kv_cache_scheme': None, 'sparsity_config': {},
            'global_compression_ratio': None, 'version': '0.12.2'}


def quantised(name, shape):
    """Whether the script quantises this tensor: 2-D weights under model.layers but norms."""
    return name.startswith('model.layers.') and name.endswith('.weight') and len(shape) == 2 and 'norm' not in name


def quantise(shape, values, layout, block, scale_dtype):
    """(codes, scales [grid rows][grid cols] as stored, the grid's block shape): scale = absmax / 448 of each block."""
    rows, cols = shape
    br, bc = {'tensor': (rows, cols), 'channel': (1, cols), 'block': tuple(block or (rows, cols))}[layout]
    grid_rows, grid_cols = -(-rows // br), -(-cols // bc)
    scales = []
    for gr in range(grid_rows):
        for gc in range(grid_cols):
            amax = 0.0
            for r in range(gr * br, min(rows, (gr + 1) * br)):
                row = values[r * cols + gc * bc: r * cols + min(cols, (gc + 1) * bc)]
                amax = max(amax, max(abs(v) for v in row))
            s = f32(amax / FP8_MAX) if amax > 0 else 1.0
            scales.append(bf16(s) if scale_dtype == 'BF16' else s)
    codes = bytearray(rows * cols)
    for r in range(rows):
        for c in range(cols):
            codes[r * cols + c] = e4m3_code(values[r * cols + c] / scales[(r // br) * grid_cols + c // bc])
    return codes, scales, (br, bc, grid_rows, grid_cols)


def write_layout(src, out, name, tensors, config):
    qc, layout, block, scale_dtype, suffix, static, left_out = LAYOUTS[name]
    if qc == 'compressed-tensors':
        qc = compressed_tensors_config(layout, block, static, left_out)
    fp8, ref = {}, {}
    for tname, (shape, values) in tensors.items():
        module = tname[:-len('.weight')] if tname.endswith('.weight') else tname
        if not quantised(tname, shape) or module in left_out:
            fp8[tname] = ref[tname] = ('F32', shape, values.tobytes())
            continue
        codes, scales, (br, bc, grid_rows, grid_cols) = quantise(shape, values, layout, block, scale_dtype)
        fp8[tname] = ('F8_E4M3', shape, bytes(codes))
        scale_shape = {'tensor': [] if qc.get('quant_method') == 'fp8' else [1],
                       'channel': [shape[0], 1], 'block': [grid_rows, grid_cols]}[layout]
        blob = bf16_bytes(scales) if scale_dtype == 'BF16' else array('f', scales).tobytes()
        fp8[module + '.' + suffix] = (scale_dtype, scale_shape, blob)
        if static:  # a per-tensor activation scale, as calibration would leave (not read by this runtime)
            fp8[module + '.input_scale'] = ('F32', [] if qc.get('quant_method') == 'fp8' else [1],
                                            array('f', [0.02]).tobytes())
        rows, cols = shape
        deq = array('f', [f32(e4m3_value(codes[r * cols + c]) * scales[(r // br) * grid_cols + c // bc])
                          for r in range(rows) for c in range(cols)])
        ref[tname] = ('F32', shape, deq.tobytes())
    for folder, weights, cfg in ((name, fp8, dict(config, quantization_config=qc)),
                                 (name + '-ref', ref, config)):
        path = os.path.join(out, folder)
        os.makedirs(path, exist_ok=True)
        for f in os.listdir(src):
            if f not in ('config.json', 'model.safetensors', 'refs.json') and os.path.isfile(os.path.join(src, f)):
                shutil.copy(os.path.join(src, f), path)
        with open(os.path.join(path, 'config.json'), 'w') as f:
            json.dump(cfg, f, indent=1)
        write_safetensors(os.path.join(path, 'model.safetensors'), weights)


def random_llama(path, seed=17):
    """A float32 Llama the CUDA runner takes (head_dim 64, GQA 3, hidden 192, intermediate 320: partial 128-blocks)."""
    rnd = random.Random(seed)
    hidden, inter, heads, kv_heads, head_dim, layers, vocab = 192, 320, 3, 1, 64, 2, 256
    config = {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'hidden_size': hidden,
              'intermediate_size': inter, 'num_hidden_layers': layers, 'num_attention_heads': heads,
              'num_key_value_heads': kv_heads, 'head_dim': head_dim, 'vocab_size': vocab,
              'max_position_embeddings': 256, 'rms_norm_eps': 1e-5, 'rope_theta': 10000.0, 'hidden_act': 'silu',
              'tie_word_embeddings': False, 'bos_token_id': 1, 'eos_token_id': 2, 'torch_dtype': 'float32'}

    def uniform(shape, fan_in):
        a = math.sqrt(3.0 / fan_in)
        return ('F32', shape, array('f', [rnd.uniform(-a, a) for _ in range(shape[0] * shape[1])]).tobytes())

    def norm():
        return ('F32', [hidden], array('f', [1.0 + rnd.uniform(-0.1, 0.1) for _ in range(hidden)]).tobytes())

    t = {'model.embed_tokens.weight': uniform([vocab, hidden], 1.0), 'model.norm.weight': norm(),
         'lm_head.weight': uniform([vocab, hidden], hidden)}
    for l in range(layers):
        p = f'model.layers.{l}.'
        t[p + 'input_layernorm.weight'] = norm()
        t[p + 'post_attention_layernorm.weight'] = norm()
        t[p + 'self_attn.q_proj.weight'] = uniform([heads * head_dim, hidden], hidden)
        t[p + 'self_attn.k_proj.weight'] = uniform([kv_heads * head_dim, hidden], hidden)
        t[p + 'self_attn.v_proj.weight'] = uniform([kv_heads * head_dim, hidden], hidden)
        t[p + 'self_attn.o_proj.weight'] = uniform([hidden, heads * head_dim], heads * head_dim)
        t[p + 'mlp.gate_proj.weight'] = uniform([inter, hidden], hidden)
        t[p + 'mlp.up_proj.weight'] = uniform([inter, hidden], hidden)
        t[p + 'mlp.down_proj.weight'] = uniform([hidden, inter], inter)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, 'config.json'), 'w') as f:
        json.dump(config, f, indent=1)
    write_safetensors(os.path.join(path, 'model.safetensors'), t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('src', help='a float32 checkpoint folder (with --random-llama: where to write one)')
    ap.add_argument('out', nargs='?', help='the folder of the layouts')
    ap.add_argument('--layouts', default=','.join(LAYOUTS), help='comma-separated, of: ' + ', '.join(LAYOUTS))
    ap.add_argument('--random-llama', action='store_true', help='write a seeded random float32 Llama into SRC')
    args = ap.parse_args()
    if args.random_llama:
        random_llama(args.src)
        return
    if not args.out:
        ap.error('OUT is required')
    with open(os.path.join(args.src, 'config.json')) as f:
        config = json.load(f)
    tensors = read_safetensors(os.path.join(args.src, 'model.safetensors'))
    for name in args.layouts.split(','):
        if name not in LAYOUTS:
            ap.error(f'unknown layout {name}')
        write_layout(args.src, args.out, name, tensors, config)


if __name__ == '__main__':
    main()
