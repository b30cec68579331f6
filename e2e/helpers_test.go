package e2e

import (
	"fmt"
	"strings"
)

func fmtSscan(s string, v ...any) (int, error) { return fmt.Sscan(strings.TrimSpace(s), v...) }
