"""Pull mode's names where they have always been imported from.

Pull mode lives in the consumer package: the requests' queue in
:mod:`nsq_sansio.consumer.fetches`, the coordinator's side in :mod:`nsq_sansio.consumer.pull`,
the shares in :mod:`nsq_sansio.consumer.shares`, and :class:`FetchResult` / :class:`FetchEnd`
(what a fetch answers) with the other actions in :mod:`nsq_sansio.consumer.actions`.
"""

from .consumer.actions import FetchEnd, FetchResult
from .consumer.fetches import FetchQueue, FetchRequest

__all__ = ["FetchEnd", "FetchQueue", "FetchRequest", "FetchResult"]
