"""Built-in drivers; importing this package registers them.

``mock`` is pure numpy. ``lerobot`` imports LeRobot, and ``sim`` ManiSkill, only when a
component connects, so registering them costs nothing and a missing SDK or simulator
surfaces as a DriverUnavailableError.
"""

from rlinf_nb.robots.drivers import lerobot, mock, sim  # noqa: F401
