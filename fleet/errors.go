package fleet

import (
	"errors"
	"fmt"
)

// ErrInvalidConfig is the sentinel of every error a constructor of this
// package returns for a Config it rejects; the error names the field, what
// it held and what is allowed.
var ErrInvalidConfig = errors.New("fleet: invalid config")

// configError reports one invalid field. It Is ErrInvalidConfig.
type configError struct {
	field string
	value any
	want  string
}

func (e *configError) Error() string {
	return fmt.Sprintf("fleet: %s is %v; want %s", e.field, e.value, e.want)
}

func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }
