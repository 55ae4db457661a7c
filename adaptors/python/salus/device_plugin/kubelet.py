"""gRPC plumbing of the kubelet's device plugin (v1beta1) and PodResources (v1) APIs.

Both sides of each service are here, as generic handlers and stubs over the messages
generated from proto/k8s: the plugin serves `DevicePlugin` and calls `Registration` and
`PodResourcesLister`; a kubelet (the tests' fake one) does the opposite. grpcio's own code
generator is not needed: a method is its full name and its message types."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from salus._generated.k8s import deviceplugin_v1beta1_pb2 as dp
from salus._generated.k8s import podresources_v1_pb2 as pr

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"  # the kubelet's registration socket in the device-plugins dir
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

_DEVICE_PLUGIN = "v1beta1.DevicePlugin"
_REGISTRATION = "v1beta1.Registration"
_POD_RESOURCES = "v1.PodResourcesLister"


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()


def _unary(fn: Callable[[Any, grpc.ServicerContext], Any], request: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=request.FromString, response_serializer=_serialize)


def _stream(fn: Callable[[Any, grpc.ServicerContext], Iterator[Any]],
            request: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_stream_rpc_method_handler(
        fn, request_deserializer=request.FromString, response_serializer=_serialize)


def device_plugin_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """`DevicePlugin` served by `servicer`'s methods of the same names."""
    return grpc.method_handlers_generic_handler(_DEVICE_PLUGIN, {
        "GetDevicePluginOptions": _unary(servicer.GetDevicePluginOptions, dp.Empty),
        "ListAndWatch": _stream(servicer.ListAndWatch, dp.Empty),
        "Allocate": _unary(servicer.Allocate, dp.AllocateRequest),
        "PreStartContainer": _unary(servicer.PreStartContainer, dp.PreStartContainerRequest),
    })


def registration_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """`Registration` (the kubelet's side) served by `servicer.Register`."""
    return grpc.method_handlers_generic_handler(
        _REGISTRATION, {"Register": _unary(servicer.Register, dp.RegisterRequest)})


def pod_resources_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """`PodResourcesLister` (the kubelet's side) served by `servicer.List`."""
    return grpc.method_handlers_generic_handler(
        _POD_RESOURCES, {"List": _unary(servicer.List, pr.ListPodResourcesRequest)})


def unix_channel(path: str) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{path}")


def unix_server(path: str, handler: grpc.GenericRpcHandler, workers: int = 8) -> grpc.Server:
    """A started server on the unix socket `path` (which must not exist)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    server.add_generic_rpc_handlers((handler,))
    if server.add_insecure_port(f"unix://{path}") == 0:
        raise OSError(f"cannot listen on {path}")
    server.start()
    return server


class _Stub:
    def __init__(self, channel: grpc.Channel, service: str) -> None:
        self._channel = channel
        self._service = service

    def _unary(self, method: str, response: Any) -> Callable[..., Any]:
        return self._channel.unary_unary(f"/{self._service}/{method}",
                                         request_serializer=_serialize,
                                         response_deserializer=response.FromString)

    def _stream(self, method: str, response: Any) -> Callable[..., Any]:
        return self._channel.unary_stream(f"/{self._service}/{method}",
                                          request_serializer=_serialize,
                                          response_deserializer=response.FromString)


class RegistrationStub(_Stub):
    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(channel, _REGISTRATION)
        self.Register = self._unary("Register", dp.Empty)


class PodResourcesStub(_Stub):
    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(channel, _POD_RESOURCES)
        self.List = self._unary("List", pr.ListPodResourcesResponse)


class DevicePluginStub(_Stub):
    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(channel, _DEVICE_PLUGIN)
        self.GetDevicePluginOptions = self._unary("GetDevicePluginOptions",
                                                  dp.DevicePluginOptions)
        self.ListAndWatch = self._stream("ListAndWatch", dp.ListAndWatchResponse)
        self.Allocate = self._unary("Allocate", dp.AllocateResponse)
        self.PreStartContainer = self._unary("PreStartContainer", dp.PreStartContainerResponse)
