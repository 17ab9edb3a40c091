"""The one model of a ``JudgeQueue`` spec: fields, defaults, ranges, cross-field rules, role settings (pure).

Its modules, bottom up: ``fields`` (every field declared once), ``rules`` (the cross-field rules),
``model`` (the typed spec), ``lists`` and ``parse`` (reading a manifest), ``roles`` (a role's
variables); this package re-exports their public names.

The operator (``controllers/``) and ``judgequeue local`` (``core/manifest.py``) both parse a manifest
with :func:`parse_spec`, so they accept and refuse the same manifests, and both turn a parsed spec into
a role's ``JUDGEQUEUE_*`` variables with :func:`role_settings`:

- :data:`FIELDS` lists every scalar field once: its type, default, bounds, description and, when it
  configures a role, the :class:`~judgequeue.core.config.Settings` field it sets. A field that sets a
  role's setting is built from that setting's row in ``core/settings_table.py`` (kind, default,
  bounds, choices, pattern, description, the roles that read it), so the spec refuses what a role
  refuses, and a row with a spec path is a field here even when not placed by hand.
- :data:`RULES` are the cross-field rules: the check, and the CRD's CEL rule with the same message
  (a row's upper bound on a duration is one too).
- The CRD's ``spec`` schema is generated from these (``controllers/crd.py``, written by
  ``scripts/gen_chart_files.py``, as the chart's RBAC is): a new field is written here (a role
  setting: in its row) and where it is used, and ``tests/unit/test_spec_model.py`` fails while
  crds/judgequeue.yaml differs from the model.
- A role gets exactly the variables it reads: the row names the roles that read its setting
  (``worker.lease_ttl`` goes to workers only; the reaper prunes dispatcher waiters by the dispatchers'
  schedule, so it reads that too). ``tests/unit/test_spec_model.py`` checks this against what each
  role's modules read.
- The typed spec (:class:`JudgeQueueSpec`) carries what the operator itself reads (replicas,
  resources, the judge, ...); a setting only a role reads reaches it through :func:`role_settings`.

The judge is checked by name only (the CRD's pattern): whether the plugin is installed is known only
in the image, so the worker checks it at start (``load_judge``) rather than the operator against a
list of built-in names.

The API server's schema rejects most mistakes at admission, but the operator must not trust that (a
CRD applied without its schema, an older CRD version, a hand-edited object), so every rule is checked
here too. Every error starts with the field's path (``spec.worker.minReplicas: ...``).
"""

from __future__ import annotations

from ..base.classes import DEFAULT_SHARE, MAX_CLASSES
from ..setting_values import JUDGE_PATTERN, QUEUE_PATTERN
from ..settings_table import ROLES, Role
from .fields import (
    CIDR_PATTERN,
    CLASSES,
    COMPARED_RESOURCES,
    CREDENTIAL_COMPONENTS,
    CREDENTIAL_KEYS,
    CREDENTIALS,
    DEFAULTED_OBJECTS,
    DRIFT_POLICIES,
    DURATION_MAX_LENGTH,
    DURATION_PATTERN,
    ENDPOINT_CONCURRENCY,
    ENDPOINT_DEADLINE,
    ENDPOINT_NAME_PATTERN,
    ENDPOINT_RATE_PATTERN,
    ENDPOINT_TRIES,
    ENDPOINT_URL_DIR,
    ENDPOINT_URL_MAX_LENGTH,
    ENDPOINT_URL_PATTERN,
    ENDPOINTS,
    ENDPOINTS_MAX,
    ENDPOINTS_VARIABLE,
    FIELD_BY_PATH,
    FIELDS,
    IPV4_NETWORK_RULE,
    LISTEN_SECRET,
    LONG_DURATION_PATTERN,
    NAME_MAX_LENGTH,
    OBJECT_DESCRIPTIONS,
    QUANTITY_RE,
    QUANTITY_SUFFIXES,
    RESOURCE_AMOUNTS,
    RESOURCES,
    SANDBOX_MODES,
    SANDBOX_VARIABLE,
    SECRET_KEY_PATTERN,
    SECRET_NAME_RE,
    SECRET_SETTINGS,
    WEBHOOK_CONCURRENCY,
    WEBHOOK_DEADLINE,
    WEBHOOK_DEADLINE_MAX,
    WEBHOOK_MAX_ATTEMPTS,
    WEBHOOKS,
    WEBHOOKS_MAX,
    WEBHOOKS_VARIABLE,
    Field,
    Kind,
    setting_default,
)
from .lists import (
    parse_classes,
    parse_endpoints,
    parse_webhooks,
)
from .model import (
    Autoscaling,
    Backoff,
    CutoverSpec,
    DispatcherSpec,
    EgressPeer,
    EndpointSpec,
    JudgeQueueSpec,
    NetworkPolicySpec,
    ReaperSpec,
    RoleCredentials,
    SecretKeyRef,
    ShadowWorkers,
    WebhookSpec,
    WorkerSpec,
    endpoint_url_file,
    webhook_file,
)
from .parse import (
    parse_quantity,
    parse_spec,
    parse_timestamp,
    quantity_rule_message,
)
from .roles import (
    INTAKE_PATH,
    endpoint_secrets,
    endpoints_setting,
    fleet_intake,
    role_fields,
    role_secrets,
    role_settings,
    webhook_secrets,
    webhooks_setting,
)
from .rules import (
    RULES,
    Rule,
    object_paths,
)

__all__ = [
    'CIDR_PATTERN',
    'CLASSES',
    'COMPARED_RESOURCES',
    'CREDENTIALS',
    'CREDENTIAL_COMPONENTS',
    'CREDENTIAL_KEYS',
    'DEFAULTED_OBJECTS',
    'DEFAULT_SHARE',
    'DRIFT_POLICIES',
    'DURATION_MAX_LENGTH',
    'DURATION_PATTERN',
    'ENDPOINTS',
    'ENDPOINTS_MAX',
    'ENDPOINTS_VARIABLE',
    'ENDPOINT_CONCURRENCY',
    'ENDPOINT_DEADLINE',
    'ENDPOINT_NAME_PATTERN',
    'ENDPOINT_RATE_PATTERN',
    'ENDPOINT_TRIES',
    'ENDPOINT_URL_DIR',
    'ENDPOINT_URL_MAX_LENGTH',
    'ENDPOINT_URL_PATTERN',
    'FIELDS',
    'FIELD_BY_PATH',
    'INTAKE_PATH',
    'IPV4_NETWORK_RULE',
    'JUDGE_PATTERN',
    'LISTEN_SECRET',
    'LONG_DURATION_PATTERN',
    'MAX_CLASSES',
    'NAME_MAX_LENGTH',
    'OBJECT_DESCRIPTIONS',
    'QUANTITY_RE',
    'QUANTITY_SUFFIXES',
    'QUEUE_PATTERN',
    'RESOURCES',
    'RESOURCE_AMOUNTS',
    'ROLES',
    'RULES',
    'SANDBOX_MODES',
    'SANDBOX_VARIABLE',
    'SECRET_KEY_PATTERN',
    'SECRET_NAME_RE',
    'SECRET_SETTINGS',
    'WEBHOOKS',
    'WEBHOOKS_MAX',
    'WEBHOOKS_VARIABLE',
    'WEBHOOK_CONCURRENCY',
    'WEBHOOK_DEADLINE',
    'WEBHOOK_DEADLINE_MAX',
    'WEBHOOK_MAX_ATTEMPTS',
    'Autoscaling',
    'Backoff',
    'CutoverSpec',
    'DispatcherSpec',
    'EgressPeer',
    'EndpointSpec',
    'Field',
    'JudgeQueueSpec',
    'Kind',
    'NetworkPolicySpec',
    'ReaperSpec',
    'Role',
    'RoleCredentials',
    'Rule',
    'SecretKeyRef',
    'ShadowWorkers',
    'WebhookSpec',
    'WorkerSpec',
    'endpoint_secrets',
    'endpoint_url_file',
    'endpoints_setting',
    'fleet_intake',
    'object_paths',
    'parse_classes',
    'parse_endpoints',
    'parse_quantity',
    'parse_spec',
    'parse_timestamp',
    'parse_webhooks',
    'quantity_rule_message',
    'role_fields',
    'role_secrets',
    'role_settings',
    'setting_default',
    'webhook_file',
    'webhook_secrets',
    'webhooks_setting',
]
