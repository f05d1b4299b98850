"""Running sessions on several node processes: membership of nodes, and placement on them."""

from supervision.cluster.membership import Membership as Membership
from supervision.cluster.membership import MembershipError as MembershipError
from supervision.cluster.membership import MembershipView as MembershipView
from supervision.cluster.membership import NodeInfo as NodeInfo
from supervision.cluster.placement import PlacementError as PlacementError
from supervision.cluster.placement import owner as owner
from supervision.cluster.placement import ranked as ranked
