"""Errors a user can act on: the CLI and the server print their message, never a traceback."""


class SpecDecodeError(Exception):
    """Base class for problems caused by input or environment, not by a bug."""


class ModelError(SpecDecodeError):
    """A model cannot be found, fetched, verified or loaded."""


class UnsupportedDtype(ModelError):
    """The requested weight precision does not exist for this model's backend."""


class InputError(SpecDecodeError):
    """A request is invalid: bad sampling values, prompt longer than the context, ... param: the API field at fault,
    where the check knows it (the server's 400 names it)."""

    def __init__(self, message: str = "", param: str | None = None):
        super().__init__(message)
        self.param = param


class ChatTemplateError(InputError):
    """The model's chat template refuses the messages (its raise_exception) or cannot render them."""


class ToolsUnsupported(ChatTemplateError):
    """The model's chat template has no place for tools: it renders a chat the same with and without them."""


def require_extra(extra: str, *modules: str) -> None:
    """Refuse in one line a command whose optional dependencies (an extra of pyproject.toml) are not installed:
    the core library installs only what decoding needs."""
    from importlib import import_module

    missing = []
    for name in modules:
        try:
            import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise SpecDecodeError(f"this needs the '{extra}' extra ({', '.join(missing)} not installed): "
                              f"pip install -e '.[{extra}]' in the checkout, or scripts/setup.sh {extra}")
