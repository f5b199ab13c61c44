"""Typed application arguments: everything under `args:` in serve_config.yaml.

The package's face: the rest of the code imports its config types from here. Each part
lives in a module of its own: `app.py` (the whole app's arguments and the ingress's
traffic settings), `encoders.py` (embedding and rerank models), `generation.py` (the LLM),
`base.py` (what every model deployment shares, its batching included), `cache.py`,
`batches.py`, `traffic.py`, `serve_options.py` (Serve's options for one deployment),
`output_neutral.py` (the mark that keeps a setting out of the result cache's key) and
`strict.py` (`StrictModel`, the base of them all: an unknown key is an error).
"""

from deployments.config.app import AdmissionConfig, AppConfig, AuthConfig, TenantConfig
from deployments.config.base import ModelBatching, ModelDeploymentConfig
from deployments.config.batches import BatchesConfig
from deployments.config.cache import CacheConfig
from deployments.config.encoders import EmbeddingModelConfig, EncoderModelConfig, RerankModelConfig
from deployments.config.generation import GenerationModelConfig, GenerationQueue
from deployments.config.serve_options import DeploymentOptions

# Any one model's config, whatever its task.
ModelConfig = EmbeddingModelConfig | RerankModelConfig | GenerationModelConfig

__all__ = [
    "AdmissionConfig",
    "AppConfig",
    "AuthConfig",
    "BatchesConfig",
    "CacheConfig",
    "DeploymentOptions",
    "EmbeddingModelConfig",
    "EncoderModelConfig",
    "GenerationModelConfig",
    "GenerationQueue",
    "ModelBatching",
    "ModelConfig",
    "ModelDeploymentConfig",
    "RerankModelConfig",
    "TenantConfig",
]
