"""rlcore-test-boom: a plugin that fails to import (a test fixture)."""
