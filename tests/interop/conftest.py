import pytest

from batmand.lab.kernel_node import kernel_nodes_available


def require_kernel_nodes(count: int) -> None:
    """Skip, loudly, when qemu cannot run kernel nodes here (CI prints the reason)."""
    ok, why = kernel_nodes_available(count)
    if not ok:
        print(f"\nINTEROP TESTS SKIPPED: {why}")
        pytest.skip(f"kernel nodes unavailable: {why}")


def pytest_report_header(config):
    ok, why = kernel_nodes_available(1)
    return f"kernel nodes: {'available' if ok else 'UNAVAILABLE'} ({why})"
