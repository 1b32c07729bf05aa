import pytest


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    ray.shutdown()
