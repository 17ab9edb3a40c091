"""The ``http-call`` judge as a package: :mod:`.judge` (the plugin, its settings and the pure
classification of answers) and :mod:`.client` (the bounded HTTP/1.1 POST it makes). The entry
point ``judgequeue.core.judges.http_call:HttpCallJudge`` and the settings loader are exported here.
"""

from .judge import ENDPOINTS_VAR, CallSettings, Endpoint, HttpCallJudge, load_call_settings

__all__ = ["ENDPOINTS_VAR", "CallSettings", "Endpoint", "HttpCallJudge", "load_call_settings"]
