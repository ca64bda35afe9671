from torchvision._absent import module_getattr as __getattr__  # noqa: F401
