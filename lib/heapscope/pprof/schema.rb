# frozen_string_literal: true

# profile.proto's field numbers: the only file of the Ruby reader that knows the schema's numbers.
module Heapscope
  module Pprof
    # Field numbers of profile.proto, each with its type.
    TAG_PROFILE_SAMPLE_TYPE = 1          # repeated ValueType
    TAG_PROFILE_SAMPLE = 2               # repeated Sample
    TAG_PROFILE_MAPPING = 3              # repeated Mapping
    TAG_PROFILE_LOCATION = 4             # repeated Location
    TAG_PROFILE_FUNCTION = 5             # repeated Function
    TAG_PROFILE_STRING_TABLE = 6         # repeated string
    TAG_PROFILE_DROP_FRAMES = 7          # int64 (string table index)
    TAG_PROFILE_KEEP_FRAMES = 8          # int64 (string table index)
    TAG_PROFILE_TIME_NANOS = 9           # int64
    TAG_PROFILE_DURATION_NANOS = 10      # int64
    TAG_PROFILE_PERIOD_TYPE = 11         # ValueType
    TAG_PROFILE_PERIOD = 12              # int64
    TAG_PROFILE_COMMENT = 13             # repeated int64 (string table indices)
    TAG_PROFILE_DEFAULT_SAMPLE_TYPE = 14 # int64 (string table index)

    TAG_VALUE_TYPE_TYPE = 1 # int64 (string table index)
    TAG_VALUE_TYPE_UNIT = 2 # int64 (string table index)

    TAG_SAMPLE_LOCATION = 1 # repeated uint64
    TAG_SAMPLE_VALUE = 2    # repeated int64
    TAG_SAMPLE_LABEL = 3    # repeated Label

    TAG_LABEL_KEY = 1      # int64 (string table index)
    TAG_LABEL_STR = 2      # int64 (string table index)
    TAG_LABEL_NUM = 3      # int64
    TAG_LABEL_NUM_UNIT = 4 # int64 (string table index)

    TAG_MAPPING_ID = 1                # uint64
    TAG_MAPPING_START = 2             # uint64
    TAG_MAPPING_LIMIT = 3             # uint64
    TAG_MAPPING_OFFSET = 4            # uint64
    TAG_MAPPING_FILENAME = 5          # int64 (string table index)
    TAG_MAPPING_BUILD_ID = 6          # int64 (string table index)
    TAG_MAPPING_HAS_FUNCTIONS = 7     # bool
    TAG_MAPPING_HAS_FILENAMES = 8     # bool
    TAG_MAPPING_HAS_LINE_NUMBERS = 9  # bool
    TAG_MAPPING_HAS_INLINE_FRAMES = 10 # bool

    TAG_LOCATION_ID = 1         # uint64
    TAG_LOCATION_MAPPING_ID = 2 # uint64
    TAG_LOCATION_ADDRESS = 3    # uint64
    TAG_LOCATION_LINE = 4       # repeated Line
    TAG_LOCATION_IS_FOLDED = 5  # bool

    TAG_LINE_FUNCTION_ID = 1 # uint64
    TAG_LINE_LINE = 2        # int64

    TAG_FUNCTION_ID = 1          # uint64
    TAG_FUNCTION_NAME = 2        # int64 (string table index)
    TAG_FUNCTION_SYSTEM_NAME = 3 # int64 (string table index)
    TAG_FUNCTION_FILENAME = 4    # int64 (string table index)
    TAG_FUNCTION_START_LINE = 5  # int64
  end
end
