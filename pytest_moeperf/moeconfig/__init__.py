"""Fused-MoE kernel configs: names vLLM looks up, file checks, M coverage, variants, git changes.

Kept import-light (no numpy, no vLLM): pytest imports this package at start-up.
"""

from pytest_moeperf.moeconfig.coverage import (
    CoverageDiff,
    CoverageEntry,
    CoverageReport,
    CoverageWarning,
    TilingChange,
    coverage_report,
    diff_coverage,
    nearest_key,
    pad_to_capture_size,
)
from pytest_moeperf.moeconfig.folder import (
    ENV_VAR,
    IN_TREE,
    ConfigResolution,
    ConfigVariant,
    config_hash,
    env_for,
    in_tree_config_dir,
    in_tree_variant,
    lay_out_config_folder,
    resolve_config,
)
from pytest_moeperf.moeconfig.gitdiff import (
    ChangedConfig,
    changed_between_folders,
    changed_config_files,
)
from pytest_moeperf.moeconfig.naming import (
    MoeConfigName,
    expected_config_name,
    is_config_file_name,
    normalize_device_name,
    parse,
)
from pytest_moeperf.moeconfig.validate import (
    TileConfig,
    find_problems,
    load_config,
    parse_config_text,
    validate_config,
)

__all__ = [
    "ENV_VAR",
    "IN_TREE",
    "ChangedConfig",
    "ConfigResolution",
    "ConfigVariant",
    "CoverageDiff",
    "CoverageEntry",
    "CoverageReport",
    "CoverageWarning",
    "MoeConfigName",
    "TileConfig",
    "TilingChange",
    "changed_between_folders",
    "changed_config_files",
    "config_hash",
    "coverage_report",
    "diff_coverage",
    "env_for",
    "expected_config_name",
    "find_problems",
    "in_tree_config_dir",
    "in_tree_variant",
    "is_config_file_name",
    "lay_out_config_folder",
    "load_config",
    "nearest_key",
    "normalize_device_name",
    "pad_to_capture_size",
    "parse",
    "parse_config_text",
    "resolve_config",
    "validate_config",
]
