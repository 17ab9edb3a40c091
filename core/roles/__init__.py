"""The roles: the dispatcher, the worker and the reaper. A role never imports another role; what two
of them share stands in a lower layer."""
