"""kubelet pod-resources API v1 client: which devices each container on this node holds."""

from collector.agent.podresources.client import AttributionCache, PodResourcesClient, PodResourcesError
from collector.agent.podresources.dra import Allocation, DraResolver

__all__ = ["Allocation", "AttributionCache", "DraResolver", "PodResourcesClient", "PodResourcesError"]
