"""Placeholders for whatever torchvision name is imported: usable as a class or value, failing when called."""


class Absent(type):
    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"torchvision.{cls.__name__} called, but this is the test bed's stand-in (no images)")

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Absent(f"{cls.__name__}.{name}", (), {})


def module_getattr(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return Absent(name, (), {})
