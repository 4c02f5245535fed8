package guardgrpc

import (
	"errors"
	"fmt"
)

// ErrInvalidConfig is the sentinel every error of NewClient and NewServer
// about their configuration Is.
var ErrInvalidConfig = errors.New("guardgrpc: invalid config")

// configError is an invalid field; err is the cause, when the field is the
// configuration of another package.
type configError struct {
	msg string
	err error
}

func (e *configError) Error() string        { return e.msg }
func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }
func (e *configError) Unwrap() error        { return e.err }

func invalid(format string, args ...any) error {
	return &configError{msg: fmt.Sprintf("guardgrpc: "+format, args...)}
}
