def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "deepspeed: DeepSpeed CPU smoke test (JIT-builds one op once; deselect with "
        "-m 'not deepspeed')",
    )
