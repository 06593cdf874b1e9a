"""The GPU path's tests run everywhere: on a machine without CUDA, the same Triton kernels run on CPU tensors in
Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined, so it is set here, before any test
imports them). The interpreter's integer-overflow checks (a debugging aid that costs it most of its time) are off,
and triton.language is patched for the interpreter once, not at every launch (below)."""
import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _patch_language_once(interpreter) -> None:
    """Triton's interpreter patches triton.language's builtins (~200 of them, each wrapped to call the interpreter's
    semantics over its one builder, `interpreter_builder`) at every launch and restores them after it, and patches
    them again at every call of a jit helper inside a kernel: together about half of a test's time. The patches are
    the same every time, and restoring them matters only to a process that also compiles kernels, which a process
    that interprets them (TRITON_INTERPRET=1, where this runs) never does: here they are made once per language
    module the kernels see (triton.language, triton.language.core) and kept. Each kernel still runs exactly as the
    interpreter runs it."""
    if getattr(interpreter._patch_lang, "once", False):
        return
    import triton.language as tl
    from triton.language import core

    patch_lang, patched = interpreter._patch_lang, set()

    def patch_lang_once(fn):
        langs = {id(value) for value in fn.__globals__.values() if value is tl or value is core}
        if not langs <= patched:
            patch_lang(fn)  # its scope is dropped: nothing restores these patches
            patched.update(langs)
        return interpreter._LangPatchScope()  # nothing to restore

    patch_lang_once.once = True
    interpreter._patch_lang = patch_lang_once


@pytest.fixture(autouse=True)
def _fast_interpreter():
    # CI installs the test extra, Triton included: there a missing Triton fails these tests instead of skipping them
    required = any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("CI", "SPECDECODE_REQUIRE_KERNEL"))
    triton = __import__("triton") if required else pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime import interpreter

        builder = interpreter.interpreter_builder
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
        if hasattr(interpreter, "_patch_lang") and hasattr(interpreter, "_LangPatchScope"):
            _patch_language_once(interpreter)
    return triton
