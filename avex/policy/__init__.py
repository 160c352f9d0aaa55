"""The AVEX policy, and the serving path beside it.

    config.py    PolicyConfig: the policy's sizes
    network.py   AVEXPolicy: the text-conditioned scorer (Section 3.2) and its selection
    saved.py     a saved policy: TrainedOn, the layout rule, save_pretrained / from_pretrained,
                 the one check that a folder holds a policy
    load.py      load_policy: a saved policy or a training run's (avex.run_files reads the
                 run), checked against the model it will serve
    __main__.py  python -m avex.policy: the policy's parameter count at a backbone's size
"""
from avex.policy.config import PolicyConfig
from avex.policy.load import load_policy
from avex.policy.network import (POSITION_FEATURES, AVEXPolicy, check_finite_tokens,
                                 parameter_count, position_features)
from avex.policy.saved import (ACCEPTED_LAYOUTS, LAYOUTS, POLICY_CONFIG, POLICY_FORMAT,
                               POLICY_WEIGHTS, TrainedOn, is_saved_policy, layout_of,
                               policy_record, read_policy_record, read_saved_policy,
                               row_layouts)

__all__ = ["ACCEPTED_LAYOUTS", "AVEXPolicy", "LAYOUTS", "POLICY_CONFIG", "POLICY_FORMAT",
           "POLICY_WEIGHTS", "POSITION_FEATURES", "PolicyConfig", "TrainedOn",
           "check_finite_tokens", "is_saved_policy",
           "layout_of", "load_policy", "parameter_count", "policy_record", "position_features",
           "read_policy_record", "read_saved_policy", "row_layouts"]
