"""api.launcher: the TVM-FFI executable is called directly only where TileLang's wrapper adds nothing."""

from types import SimpleNamespace

from qla_kernels.gdn.api import launcher, pack_tokens


def _kernel(**adapter_fields):
    executable = object()
    adapter = SimpleNamespace(_get_executable=lambda: executable, **adapter_fields)
    return SimpleNamespace(adapter=adapter), executable


def test_kernel_taking_every_output_as_an_argument_launches_through_its_executable():
    kernel, executable = _kernel(result_idx=[])
    assert launcher(kernel) is executable


def test_kernels_that_allocate_outputs_keep_the_tilelang_wrapper():
    for fields in ({"result_idx": [3]}, {"result_idx": [], "_ffi_callee_allocated_output_abi": True}):
        kernel, _ = _kernel(**fields)
        assert launcher(kernel) is kernel
    plain = SimpleNamespace(adapter=SimpleNamespace(result_idx=[]))  # another execution backend
    assert launcher(plain) is plain


def test_pack_tokens_returns_a_packed_tensor_as_it_is():
    import torch

    x = torch.randn(1, 5, 2, 3)
    assert pack_tokens(x) is x
    y = torch.randn(2, 5, 2, 3)
    assert pack_tokens(y).shape == (1, 10, 2, 3) and torch.equal(pack_tokens(y)[0, 5:], y[1])
    z = torch.randn(1, 2, 5, 3).transpose(1, 2)  # B = 1 but not contiguous
    assert pack_tokens(z).is_contiguous() and torch.equal(pack_tokens(z), z)
