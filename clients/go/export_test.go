package idem

// Slot is the package's CRC16 key-to-slot mapping, for the tests that
// check it against CLUSTER KEYSLOT.
var Slot = slot
