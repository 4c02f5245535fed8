package shed

// HeaderPriorityOf exposes headerPriorityOf to the tests.
var HeaderPriorityOf = headerPriorityOf
