package deadline

// The header parsers, for the tests of package deadline_test.
var (
	ParseTimeoutForTest  = parseTimeout
	ParseDeadlineForTest = parseDeadline
)
