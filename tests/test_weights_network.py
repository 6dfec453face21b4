"""Loading weights when the network fails: a proxy answering 407, no network, a timeout.

Nothing goes online: huggingface_hub's HTTP client is replaced (``huggingface_hub.set_client_factory``)
by one whose every request fails the way a real proxy or a missing network does, and which counts
the requests; its back-off sleeps are counted instead of slept. The weights, when cached, are laid
out by tests/hub_support.py.
"""

from __future__ import annotations

import importlib
import logging

import huggingface_hub
import pytest
import torch
from hub_support import lay_out_download, lay_out_folder
from huggingface_hub.utils import _http

import vit5
from vit5.errors import InputError
from vit5.introspect.load import load_spec
from vit5.weights import catalog
from vit5.weights.convert import CheckpointError

OFFICIAL = "FengWang3211/ViT-5"
TINY = dict(depth=1, embed_dim=32, num_heads=2, img_size=16, patch_size=8, num_classes=3)
HTTP = importlib.import_module(
    type(huggingface_hub.get_session()).__module__.split(".")[0]
)  # httpx(2)

FAILURES = {
    "proxy 407": lambda request: HTTP.ProxyError(
        "407 Proxy Authentication Required", request=request
    ),
    "no network": lambda request: HTTP.ConnectError(
        "[Errno -3] Temporary failure in name resolution"
    ),
    "timeout": lambda request: HTTP.ConnectTimeout("timed out", request=request),
}


class Network:
    """Every request fails with ``failure``; requests and back-off sleeps are counted."""

    def __init__(self, failure):
        self.failure, self.requests, self.sleeps = failure, [], []

    def handle(self, request):
        if "/resolve/" in str(
            request.url
        ):  # file requests (huggingface_hub also asks api/ endpoints)
            self.requests.append(str(request.url))
        raise self.failure(request)


@pytest.fixture(params=sorted(FAILURES))
def network(request, hf_cache, monkeypatch):
    """Each way the network fails, in turn."""
    yield from _failing(FAILURES[request.param], monkeypatch)


@pytest.fixture
def proxy(hf_cache, monkeypatch):
    """An HTTPS proxy that answers 407 to everything."""
    yield from _failing(FAILURES["proxy 407"], monkeypatch)


def _failing(failure, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    net = Network(failure)
    monkeypatch.setattr(_http.time, "sleep", net.sleeps.append)
    huggingface_hub.set_client_factory(
        lambda: HTTP.Client(transport=HTTP.MockTransport(net.handle))
    )
    yield net
    huggingface_hub.set_client_factory(_http.default_client_factory)
    huggingface_hub.close_session()


def test_released_weights_in_the_cache_are_used_without_the_network(proxy, hf_cache):
    lay_out_download(hf_cache, OFFICIAL, {"vit5_small_patch16_224.pth": b"cached bytes"})
    path = catalog.download(OFFICIAL, "vit5_small_patch16_224.pth")
    assert path.read_bytes() == b"cached bytes"
    assert proxy.requests == []  # released weights never change: the cached copy is used as it is


def test_not_cached_fails_after_one_request_not_a_retry_storm(network, hf_cache):
    with pytest.raises(CheckpointError, match="the Hub could not be reached") as err:
        vit5.create_model("vit5_small", pretrained=True)
    message = str(err.value)
    assert "vit5_small_patch16_224.pth of the Hugging Face Hub repo FengWang3211/ViT-5" in message
    assert "pretrained=PATH" in message  # Python's form
    assert (
        len(network.requests) == 1 and network.sleeps == []
    )  # huggingface_hub alone: 7, with back-off
    with pytest.raises(
        InputError, match=r"^cannot load vit5_small: .*pass its path as vit5_small@PATH$"
    ):
        load_spec("vit5_small")  # the command lines' form


def test_a_pushed_model_in_the_cache_is_used_when_the_hub_cannot_be_reached(
    proxy, hf_cache, tmp_path, caplog
):
    model = vit5.create_model("vit5_tiny", **TINY)
    lay_out_folder(hf_cache, "someone/tiny", vit5.save_pretrained(model, tmp_path / "run"))
    with caplog.at_level(logging.WARNING, logger="vit5"):
        loaded = vit5.load_model("hf-hub:someone/tiny")
    torch.testing.assert_close(loaded.state_dict(), model.state_dict())
    assert len(proxy.requests) == 1 and proxy.sleeps == []  # asked once whether config.json changed
    assert "could not be reached" in caplog.text and "using the cached config.json" in caplog.text


def test_timm_names_use_the_cache_and_fail_fast_the_same_way(network, hf_cache, tmp_path):
    import timm

    repo = "timm/test_vit.r160_in1k"
    with pytest.raises(
        InputError, match=rf"model.safetensors or pytorch_model.bin of .* {repo}"
    ) as err:
        load_spec("timm:test_vit.r160_in1k")
    assert "the Hub could not be reached" in str(
        err.value
    ) and "timm:test_vit.r160_in1k@PATH" in str(err.value)
    assert len(network.requests) == 1 and network.sleeps == []  # (one per file before)
    model = timm.create_model("test_vit.r160_in1k")
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    lay_out_download(hf_cache, repo, {"pytorch_model.bin": tmp_path / "pytorch_model.bin"})
    loaded = load_spec("timm:test_vit.r160_in1k").model
    torch.testing.assert_close(loaded.state_dict(), model.state_dict())
