"""One entry point to load a model by registry name, GGUF path or Hugging Face folder."""
from __future__ import annotations

import errno
import hashlib
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .. import cachefiles, kernels, pass_timings, registry
from ..errors import ModelError, UnsupportedDtype
from ..tokenizer import Tokenizer
from .config import ModelConfig, architecture_of_hf
from .transformer import Transformer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# int8: the model as llama.cpp computes it on a CPU, the file's own GGUF blocks times int8 activations
# (kernels.QuantWeight); a matrix whose blocks the int8 kernel does not read (F16, BF16, F32, other types, every
# matrix of a Hugging Face folder) is refused at load. q8_0: the same, those matrices quantized to Q8_0 at load,
# said on stderr: another model than the file's, so only on request (drafts, whose precision decides nothing, too).
QUANTIZED = {"int8", "q8_0"}
LAYER_MATRICES = ("qkv", "out_proj", "gate_up", "down")
# v2: every block type either kernel reads (v1 kept only the float32 kernel's, without Q5_0).
# Named by the block types the kernels read: a file saved when they read fewer types left those matrices out, and
# the int8 model would requantize them to Q8_0; a kernel that reads more therefore saves (and reads) a new file.
BLOCKS_FILE = "gguf_blocks-v2-{}.safetensors".format(
    hashlib.sha256(repr(sorted(kernels.GGUF_KERNEL_TYPES | kernels.QUANT_KERNEL_TYPES)).encode()).hexdigest()[:8])


@dataclass
class LoadedModel:
    name: str
    path: Path
    model: object  # Transformer or HFAdapter: forward(tokens, cache, ...) -> logits
    tokenizer: Tokenizer
    backend: str  # "native" or "transformers"
    dtype: str
    load_seconds: float
    gguf_blocks: int = 0  # matrices whose decode steps read the GGUF blocks (float32 results, fewer bytes)
    requantized: int = 0  # int8 matrices quantized to Q8_0 at load (--precision q8_0), not the file's own blocks

    @property
    def precision(self) -> str:
        if self.dtype == "int8":
            quantized = f"; {self.requantized} matrices quantized to Q8_0 at load" if self.requantized else ""
            return f"int8 (GGUF blocks x int8 activations{quantized})"
        if getattr(self.model, "exact_pass", None) is not None:
            blocks = f"; {self.gguf_blocks} matrices multiplied from their GGUF blocks" if self.gguf_blocks else ""
            return f"{self.dtype} on {self.model.device.type} (row-exact Triton kernels{blocks})"
        return f"{self.dtype}, from GGUF blocks" if self.gguf_blocks else self.dtype

    @property
    def vocab_size(self) -> int:
        m = self.model
        return m.config.vocab_size if isinstance(m, Transformer) else m.vocab_size


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# What a converted folder holds; a new version converts every file again. v2: the rope scaling in config.json
# (folders of v1 were converted without it, and a llama 3 file among them would run with unscaled frequencies).
# v3: the matrices the int8 kernel reads from their GGUF blocks are not dequantized at conversion (MATRICES_FILE).
CONVERTED_FORMAT = 3
# The float32 matrices that weights.safetensors leaves out, dequantized the first time a load needs them (float32,
# bfloat16, a GPU, a CPU without the kernel). The default int8 path never does: converting the 1.5B wrote 7.1 GB and
# took ~45 s of a first run when every matrix was dequantized.
MATRICES_FILE = "matrices.safetensors"


def _converted_dir(gguf_path: Path) -> Path:
    """The converted folder of one version of one file, keyed by its full resolved path, its size and its mtime in
    nanoseconds: two fine-tunes of the same file name and size, or a file replaced within the same second, differ."""
    resolved = gguf_path.resolve()
    stat = resolved.stat()
    identity = f"{resolved}\n{stat.st_size}\n{stat.st_mtime_ns}\nformat {CONVERTED_FORMAT}".encode("utf-8", "surrogateescape")
    return registry.cache_dir() / "converted" / f"{resolved.stem}-{hashlib.sha256(identity).hexdigest()[:16]}"


def _no_space(exc: OSError, folder: Path, what: str) -> ModelError | None:
    """A full disk as a user's error (the temporaries are gone by then), other OS errors as they are."""
    if exc.errno != errno.ENOSPC:
        return None
    return ModelError(f"no space left on the device of {folder} while {what}; free some space there, or point"
                      " SPECDECODE_CACHE at a larger disk")


# The tokenizer class AutoTokenizer picks for a GGUF of each architecture: its model type's, or TokenizersBackend where
# transformers registers none (llama). Named up front, the class is loaded directly: AutoTokenizer would first parse
# the file's whole metadata with the gguf package's reader (one numpy view per vocabulary entry: about half of a
# Qwen file's conversion) only to read the model type. The class reads the vocabulary with transformers' own fast
# reader either way (tests: the saved files are the same as AutoTokenizer's, for every architecture here).
GGUF_TOKENIZER_CLASSES = {"llama": "TokenizersBackend", "mistral": "TokenizersBackend", "phi3": "TokenizersBackend",
                          "qwen2": "Qwen2Tokenizer", "qwen3": "Qwen2Tokenizer", "gemma3": "GemmaTokenizer"}


def _load_hf_tokenizer(source: Path, gguf_file: str | None = None, arch: str | None = None):
    """The Hugging Face tokenizer of a folder, or of a GGUF file in it (`arch`: the file's architecture)."""
    import transformers

    try:
        if gguf_file:
            # a tokenizer_config.json beside the file could name another class: AutoTokenizer reads it then
            known = GGUF_TOKENIZER_CLASSES.get(arch) if not (source / "tokenizer_config.json").exists() else None
            loader = getattr(transformers, known) if known else transformers.AutoTokenizer
            return loader.from_pretrained(str(source), gguf_file=gguf_file)
        return transformers.AutoTokenizer.from_pretrained(str(source))
    except Exception as exc:
        raise ModelError(f"cannot load the tokenizer from {source / (gguf_file or '')} ({type(exc).__name__}: {exc})") from None


def convert_gguf(gguf_path: Path, quiet: bool = False) -> Path:
    """Dequantize a GGUF file once into float32 safetensors + tokenizer files; later loads read those.

    Dequantizing with the gguf package takes tens of seconds per model; reading the converted file
    takes a few. The folder appears under its final name only when complete. One process converts a
    file at a time (an flock per converted folder): others that start meanwhile (`serve --replicas N`
    on a fresh machine) wait for it and reuse its folder. Temporaries that a killed conversion left
    are removed first; a registry model's sha256 is checked while converting it (it is read whole anyway).
    """
    target = _converted_dir(gguf_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    cachefiles.sweep(target.parent, (".convert*",))
    if (target / "config.json").is_file():
        return target
    waiting = None if quiet else f"specdecode: waiting for another process converting {gguf_path.name} ..."
    with cachefiles.locked(cachefiles.lock_path("converted", target.name), waiting):
        if (target / "config.json").is_file():  # converted by the process we waited for
            return target
        _convert_locked(gguf_path, target, quiet)
    return target


def _convert_locked(gguf_path: Path, target: Path, quiet: bool) -> None:
    from safetensors.torch import save_file

    from .gguf_loader import load_gguf_model, open_gguf, read_config

    if not quiet:
        print(f"specdecode: converting {gguf_path.name} for fast loading (once) ...", file=sys.stderr)
    _verify_registry_file(gguf_path)
    reader = open_gguf(gguf_path)
    config = read_config(reader)
    tmp_path = Path(tempfile.mkdtemp(dir=target.parent, prefix=cachefiles.temp_prefix(".convert")))
    try:
        types = _save_blocks(gguf_path, config, tmp_path / BLOCKS_FILE, reader)
        later = _int8_readable(types)
        model = load_gguf_model(gguf_path, "cpu", torch.float32, None, reader, skip=later)
        hf_tok = _load_hf_tokenizer(gguf_path.parent, gguf_path.name, model.config.arch)
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k not in later}
        save_file(state, str(tmp_path / "weights.safetensors"))
        hf_tok.save_pretrained(str(tmp_path / "tokenizer"))
        _record_added_tokens(tmp_path / "tokenizer")
        (tmp_path / "config.json").write_text(json.dumps(asdict(model.config), indent=1))
        if target.exists():  # an incomplete folder (no config.json): only a lock holder writes here
            shutil.rmtree(target)
        tmp_path.rename(target)
    except OSError as exc:
        raise _no_space(exc, target.parent, f"converting {gguf_path.name}") or exc from None
    finally:
        cachefiles.remove_quietly(tmp_path)  # gone already once renamed; a killed process's is swept later


def _record_added_tokens(folder: Path) -> None:
    """Copy the added tokens of a saved tokenizer into its tokenizer_config.json, as `added_tokens_decoder`.

    transformers 5 saves them in tokenizer.json only; a folder whose config lacks them is loaded by parsing the whole
    tokenizer.json in Python once more just to find them (about half of a Qwen tokenizer's load, paid by every later
    load of the model). Loading reads the same records either way, one AddedToken per entry: the same tokenizer."""
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if "added_tokens_decoder" in config:
        return
    added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
    config["added_tokens_decoder"] = {str(token.pop("id")): token for token in added}
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _verify_registry_file(gguf_path: Path) -> None:
    """A registry model's cached file is taken on its size alone when loaded; its sha256 is checked here, once per
    conversion, since converting reads the whole file anyway."""
    entry = registry.entry_for_file(gguf_path)
    if entry is not None and registry.file_sha256(gguf_path) != entry.sha256:
        raise ModelError(f"{gguf_path} fails its sha256 check for {entry.name} (the file is corrupt or was changed);"
                         " delete it and it is pulled again")


def _load_converted(folder: Path, gguf_path: Path, device, weight_dtype, max_positions, skip=frozenset()) -> Transformer:
    """The converted float32 model; parameters named in `skip` stay unread (empty), for their blocks to replace.
    Matrices the conversion left to their blocks come from MATRICES_FILE, made the first time one is wanted."""
    from safetensors import safe_open

    config = ModelConfig(**json.loads((folder / "config.json").read_text()))
    model = Transformer(config, weight_dtype=weight_dtype, max_positions=max_positions)
    wanted = {name: param for name, param in model.named_parameters() if name not in skip}
    try:
        with safe_open(str(folder / "weights.safetensors"), framework="pt") as f:
            for name in set(f.keys()) & set(wanted):
                param = wanted.pop(name)
                param.data = f.get_tensor(name).to(device=device, dtype=param.dtype).contiguous()
        if wanted:
            _read_matrices(folder, gguf_path, config, wanted, device)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"converted weights in {folder} are unreadable ({exc}); delete that folder to rebuild") from None
    return model


def _read_matrices(folder: Path, gguf_path: Path, config: ModelConfig, wanted: dict, device) -> None:
    """The float32 matrices weights.safetensors leaves out, from MATRICES_FILE: dequantized from the GGUF file the
    first time (under the folder's conversion lock; a process that waited reads what the other wrote)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from .gguf_loader import load_gguf_model

    path = folder / MATRICES_FILE
    if not path.is_file():
        with cachefiles.locked(cachefiles.lock_path("converted", folder.name),
                               f"specdecode: waiting for another process dequantizing {gguf_path.name} ..."):
            if not path.is_file():
                cachefiles.sweep(folder, (".matrices.safetensors~*.tmp",))  # what a killed process left
                print(f"specdecode: dequantizing {gguf_path.name}'s matrices to float32 (once) ...", file=sys.stderr)
                full = load_gguf_model(gguf_path, "cpu", torch.float32, None).state_dict()
                tmp = folder / (cachefiles.temp_prefix(f".{MATRICES_FILE}") + ".tmp")
                try:
                    save_file({key: full[key].contiguous() for key in _matrix_keys(config) if key in full}, str(tmp))
                    tmp.replace(path)
                except OSError as exc:
                    raise _no_space(exc, folder, f"dequantizing {gguf_path.name}") or exc from None
                finally:
                    cachefiles.remove_quietly(tmp)
    with safe_open(str(path), framework="pt") as f:
        for name, param in wanted.items():
            if name not in f.keys():
                raise ModelError(f"converted weights in {folder} lack {name}; delete that folder to rebuild")
            param.data = f.get_tensor(name).to(device=device, dtype=param.dtype).contiguous()


def _int8_readable(types: dict[str, list[int]]) -> frozenset:
    """The matrices whose every part the int8 kernel reads from its GGUF blocks (their float32 copies wait)."""
    return frozenset(key for key, parts in types.items() if all(t in kernels.QUANT_KERNEL_TYPES for t in parts))


def _save_blocks(gguf_path: Path, config: ModelConfig, path: Path, reader=None) -> dict[str, list[int]]:
    """The blocks the kernels read, and every matrix's ggml type names (what int8 refuses or q8_0 requantizes is
    named from these, without parsing the GGUF header again). Returns each saved matrix's block types."""
    from safetensors.torch import save_file

    from .gguf_loader import matrix_types, open_gguf, read_gguf_blocks

    reader = reader or open_gguf(gguf_path)
    blocks = read_gguf_blocks(gguf_path, config, reader)
    flat = {f"{key}.{i}": data for key, parts in blocks.items() for i, (_, data) in enumerate(parts)}
    types = {key: [t for t, _ in parts] for key, parts in blocks.items()}
    names = matrix_types(config, reader)
    save_file(flat, str(path), metadata={"types": json.dumps(types), "type_names": json.dumps(names)})
    return types


def _read_blocks(gguf_path: Path, folder: Path, config: ModelConfig) -> dict:
    """The GGUF blocks of every matrix, saved next to the converted weights the first time, since parsing
    the GGUF header again (the tokenizer's metadata) is far slower than reading this file."""
    from safetensors import safe_open

    blocks_file = folder / BLOCKS_FILE
    if not blocks_file.is_file():  # converted by an older version
        cachefiles.sweep(folder, (".gguf_blocks-*.tmp",))
        for stale in folder.glob("gguf_blocks-*.safetensors"):  # saved for another set of block types
            cachefiles.remove_quietly(stale)
        tmp = folder / (cachefiles.temp_prefix(f".{BLOCKS_FILE}") + ".tmp")
        try:
            _save_blocks(gguf_path, config, tmp)
            tmp.replace(blocks_file)
        except OSError as exc:
            raise _no_space(exc, folder, f"saving the GGUF blocks of {gguf_path.name}") or exc from None
        finally:
            cachefiles.remove_quietly(tmp)
    try:
        with safe_open(str(blocks_file), framework="pt") as f:
            types = json.loads(f.metadata()["types"])
            return {key: [(t, f.get_tensor(f"{key}.{i}")) for i, t in enumerate(kinds)] for key, kinds in types.items()}
    except Exception as exc:
        raise ModelError(f"{blocks_file} is unreadable ({exc}); delete it to rebuild") from None


def _matrix_type_names(gguf_path: Path, folder: Path, config: ModelConfig) -> dict[str, list[str]]:
    """Each matrix's ggml type names, as saved with its blocks; a folder converted by an older version lacks them,
    and the GGUF header (seconds for a large vocabulary) is parsed again."""
    from safetensors import safe_open

    from .gguf_loader import matrix_types, open_gguf

    with safe_open(str(folder / BLOCKS_FILE), framework="pt") as f:
        saved = f.metadata().get("type_names")
    return json.loads(saved) if saved else matrix_types(config, open_gguf(gguf_path))


def _attach_blocks(model: Transformer, gguf_path: Path, folder: Path) -> int:
    """Let the float32 model read its GGUF blocks for decode steps (same outputs, fewer bytes per token)."""
    from .gguf_loader import attach_gguf_blocks

    blocks = _read_blocks(gguf_path, folder, model.config)
    return attach_gguf_blocks(model, {k: v for k, v in blocks.items() if all(t in kernels.GGUF_KERNEL_TYPES for t, _ in v)})


def _matrix_keys(config: ModelConfig) -> list[str]:
    return [f"layers.{i}.{name}" for i in range(config.n_layers) for name in LAYER_MATRICES] + ["lm_head"]


def _load_gguf_int8(gguf_path: Path, folder: Path, device, max_positions, requantize: bool) -> tuple[Transformer, int]:
    """The int8 model and how many matrices were requantized: each matrix from its GGUF blocks where the int8 kernel
    reads every part, else (requantize only) its converted float32 weights quantized to Q8_0. Float32 matrices are
    read only where needed."""
    config = ModelConfig(**json.loads((folder / "config.json").read_text()))
    blocks = {key: parts for key, parts in _read_blocks(gguf_path, folder, config).items()
              if all(t in kernels.QUANT_KERNEL_TYPES for t, _ in parts)}
    unread = [key for key in _matrix_keys(config) if key not in blocks]
    if unread:
        types = _matrix_type_names(gguf_path, folder, config)
        _refuse_or_report(gguf_path.name, [t for key in unread for t in types[key]], len(unread), requantize)
    # A tied head's blocks replace no parameter: the float32 embedding stays for lookups.
    skip = frozenset(blocks) - ({"lm_head"} if config.tie_embeddings else set())
    model = _load_converted(folder, gguf_path, device, torch.float32, max_positions, skip=skip)
    _to_quant_weights(model, blocks)
    return model, len(unread)


def _refuse_or_report(source: str, types: list[str], matrices: int, requantize: bool) -> None:
    """Matrices the int8 kernel cannot read as they are: one line refusing them (int8), or one line saying they are
    being quantized to Q8_0 (q8_0, asked for)."""
    from collections import Counter

    import gguf

    counts = ", ".join(f"{count} {name}" for name, count in sorted(Counter(types).items()))
    if not requantize:
        readable = ", ".join(gguf.GGMLQuantizationType(t).name for t in sorted(kernels.QUANT_KERNEL_TYPES))
        raise ModelError(f"{source}: {matrices} matrices hold blocks the int8 kernel does not read ({counts} tensors;"
                         f" it reads {readable}); run --precision float32 (the file's weights exactly) or --precision"
                         " q8_0 (those matrices quantized to Q8_0 at load)")
    print(f"specdecode: {source}: quantizing {matrices} matrices ({counts} tensors) to Q8_0 at load (--precision q8_0)",
          file=sys.stderr)


def _to_quant_weights(model: Transformer, blocks: dict | None = None) -> None:
    """Every layer matrix and the output head as kernels.QuantWeight: from `blocks` where given, else Q8_0."""
    blocks = blocks or {}
    for key in _matrix_keys(model.config):
        owner_path, _, attr = key.rpartition(".")
        owner = model.get_submodule(owner_path) if owner_path else model
        if key in blocks:
            weight = kernels.QuantWeight(blocks[key])
        else:
            dense = model.output_weight() if key == "lm_head" else getattr(owner, attr)
            weight = kernels.QuantWeight.from_dense(dense)
        owner._parameters.pop(attr, None)
        setattr(owner, attr, weight)


def _finish_native(model: Transformer, weight_dtype: torch.dtype, quantize: str | None = None) -> Transformer:
    if quantize and not isinstance(model.layers[0].qkv, kernels.QuantWeight):
        _to_quant_weights(model)
    elif weight_dtype != torch.float32 and model.lm_head is None:
        # Embedding lookups stay float32; the output layer gets its own low-precision copy.
        model.lm_head = torch.nn.Parameter(model.embed.to(weight_dtype), requires_grad=False)
    if model.device.type == "cpu":
        kernels.load_kernel()
    elif model.device.type == "cuda":
        from .. import gpu

        reason = gpu.attach(model)
        if reason is not None:
            print(f"specdecode: {reason}; running PyTorch's kernels, whose rows are not exact", file=sys.stderr)
    return model


def load_model(
    name_or_path: str,
    device: str | torch.device | None = None,
    dtype: str = "float32",
    max_context: int | None = 4096,
    backend: str = "auto",  # "auto" | "native" | "transformers"
) -> LoadedModel:
    if dtype not in DTYPES and dtype not in QUANTIZED:
        raise ModelError(f"unknown dtype '{dtype}' (choose from {', '.join([*DTYPES, *QUANTIZED])})")
    device = torch.device(device) if device else default_device()
    started = time.perf_counter()
    path = registry.resolve(name_or_path)
    if path.is_file() and backend != "transformers":
        _check_gguf_header(path)  # a bad file is reported before the kernel is compiled for it
        folder = convert_gguf(path)
    # On a GPU the file's own blocks (where the Triton kernel reads their type) stand for int8
    gpu_blocks = dtype in QUANTIZED and device.type == "cuda"
    dtype = _available_precision(dtype, device)
    if dtype in QUANTIZED:
        kernels.check_quant_isa()  # an instruction set this CPU lacks fails here, not in every request
        kernels.quant_isa()  # auto: where it must be measured (isa_choice), here, not inside the first pass
    name = name_or_path if name_or_path in registry.REGISTRY else path.name
    if path.is_file():
        if backend == "transformers":
            raise ModelError("the transformers backend needs a Hugging Face folder, not a GGUF file")
        model, tokenizer, blocks, requantized = _load_gguf_native(path, folder, device, dtype, max_context, gpu_blocks)
        used_backend = "native"
    elif path.is_dir():
        model, tokenizer, used_backend, requantized = _load_folder(path, device, dtype, max_context, backend)
        blocks = 0
    else:
        raise ModelError(f"model path not found: {path}")
    stored = "int8" if dtype in QUANTIZED else dtype  # q8_0 is int8 arithmetic; `requantized` says what differs
    pass_timings.keep_on_disk(model, f"{files_identity(path)}\n{dtype} {device} {used_backend}")
    return LoadedModel(name, path, model, tokenizer, used_backend, stored, time.perf_counter() - started, blocks, requantized)


def files_identity(path: Path) -> str:
    """A model file, or a folder's files, by resolved path, size and modification time: any change reads anew."""
    resolved = path.resolve()
    files = sorted(resolved.iterdir()) if resolved.is_dir() else [resolved]
    return "\n".join(f"{f} {f.stat().st_size} {f.stat().st_mtime_ns}" for f in files if f.is_file())


def _load_gguf_native(path: Path, folder: Path, device, dtype: str, max_context, gpu_blocks: bool = False):
    """(model, tokenizer, matrices reading GGUF blocks, matrices requantized to Q8_0) of a converted file;
    gpu_blocks: the Triton kernels multiply from the blocks of every matrix whose types they read."""
    config = ModelConfig(**json.loads((folder / "config.json").read_text()))
    positions = min(max_context or config.context_length, config.context_length)
    requantized = blocks = 0
    if dtype in QUANTIZED:
        model, requantized = _load_gguf_int8(path, folder, device, positions, requantize=dtype == "q8_0")
        model = _finish_native(model, torch.float32, dtype)
    elif gpu_blocks and gpu_unavailable(config, device) is None:
        from ..gpu import gguf_blocks

        readable = gguf_blocks.gpu_readable(_read_blocks(path, folder, config))
        skip = frozenset(readable) - ({"lm_head"} if config.tie_embeddings else set())
        model = _load_converted(folder, path, device, DTYPES[dtype], positions, skip=skip)
        blocks = gguf_blocks.attach(model, readable)
        model = _finish_native(model, DTYPES[dtype])
    else:
        model = _finish_native(_load_converted(folder, path, device, DTYPES[dtype], positions), DTYPES[dtype])
    if dtype == "float32" and kernels.gguf_blocks_enabled(device):
        blocks = _attach_blocks(model, path, folder)
    return model, Tokenizer.from_hf(_load_hf_tokenizer(folder / "tokenizer")), blocks, requantized


def gpu_unavailable(config: ModelConfig, device) -> str | None:
    from ..gpu import unavailable_for

    return unavailable_for(config, device)


def _load_folder(path: Path, device, dtype: str, max_context, backend: str):
    """(model, tokenizer, backend, matrices requantized to Q8_0) of a Hugging Face folder. Its matrices are float
    weights, so int8 is refused and q8_0 quantizes every one of them."""
    from .hf_loader import config_from_hf, is_native_arch, load_hf_native, read_hf_config

    hf_config = read_hf_config(path)
    tokenizer = Tokenizer.from_hf(_load_hf_tokenizer(path))
    quantize = dtype if dtype in QUANTIZED else None
    weight_dtype = torch.float32 if quantize else DTYPES[dtype]
    if backend != "transformers" and is_native_arch(hf_config):
        config = config_from_hf(hf_config)
        requantized = len(_matrix_keys(config)) if quantize else 0
        if quantize:
            stored = str(hf_config.get("dtype") or hf_config.get("torch_dtype") or "float")
            _refuse_or_report(path.name, [stored] * requantized, requantized, quantize == "q8_0")
        positions = min(max_context or config.context_length, config.context_length)
        model = _finish_native(load_hf_native(path, device, weight_dtype, positions), weight_dtype, quantize)
        return model, tokenizer, "native", requantized
    if backend == "native":
        architecture_of_hf(hf_config.get("model_type"))  # raises: names the architectures the native decoder covers
    if quantize:
        raise UnsupportedDtype(f"dtype '{dtype}' needs the native decoder; '{hf_config.get('model_type')}' runs through transformers")
    return _load_transformers(path, hf_config, device, weight_dtype, max_context), tokenizer, "transformers", 0


def prepare_model_file(name_or_path: str) -> Path:
    """What load_model does to a model's files before reading them, alone: pull a named model, convert a GGUF
    file. Run once before several processes load the same model at once (`serve --replicas`)."""
    path = registry.resolve(name_or_path)
    if path.is_file():
        _check_gguf_header(path)
        convert_gguf(path)
    return path


def _available_precision(dtype: str, device: torch.device) -> str:
    """int8 where its CPU kernel runs; on a GPU the same weights dequantized to bfloat16 (the Triton kernels' input);
    elsewhere (no compiler) the same model in float32."""
    if dtype in QUANTIZED and device.type == "cuda":
        print("specdecode: on cuda the Triton kernels multiply Q4_0 to Q8_0 and Q4_K to Q6_K matrices from their GGUF blocks"
              " and other types from bfloat16 copies, in bfloat16 (int8 is the CPU kernels' precision)", file=sys.stderr)
        return "bfloat16"
    if dtype in QUANTIZED and (device.type != "cpu" or kernels.load_kernel() is None):
        where = f"on {device.type}" if device.type != "cpu" else kernels.kernel_status()
        print(f"specdecode: int8 precision needs the CPU kernel ({where}); loading float32", file=sys.stderr)
        return "float32"
    return dtype


def _check_gguf_header(path: Path) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelError(f"{path} is not a GGUF file (bad magic {magic!r})")


def _load_transformers(path: Path, hf_config: dict, device, weight_dtype, max_context):
    from transformers import AutoModelForCausalLM

    from .hf_adapter import HFAdapter

    try:
        hf_model = AutoModelForCausalLM.from_pretrained(str(path), dtype=weight_dtype).to(device)
    except Exception as exc:
        raise ModelError(f"transformers cannot load {path} ({type(exc).__name__}: {exc})") from None
    limit = int(hf_config.get("max_position_embeddings") or 2048)
    return HFAdapter(hf_model, min(max_context or limit, limit))
