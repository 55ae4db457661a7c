"""salus-device-plugin: a kubelet device plugin that hands pods shares of the node's
salus-server (see plugin.py and docs/kubernetes.md)."""

from salus.device_plugin.plugin import DevicePlugin, Options, ResourceSpec, main, parse_size

__all__ = ["DevicePlugin", "Options", "ResourceSpec", "main", "parse_size"]
