package fleet

import "errors"

// What every constructor of the package shares, alone in this file.

// ErrInvalidConfig is the sentinel of every error a constructor of this
// package returns for a Config it rejects; the error names the field, what
// it held and what is allowed.
var ErrInvalidConfig = errors.New("fleet: invalid config")

// configError reports an invalid field. It Is ErrInvalidConfig.
type configError struct{ msg string }

func (e *configError) Error() string        { return e.msg }
func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }
