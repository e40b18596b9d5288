"""kubelet pod-resources API v1 client: which devices each container on this node holds."""

from collector.agent.podresources.client import Allocation, AttributionCache, PodResourcesClient, PodResourcesError

__all__ = ["Allocation", "AttributionCache", "PodResourcesClient", "PodResourcesError"]
