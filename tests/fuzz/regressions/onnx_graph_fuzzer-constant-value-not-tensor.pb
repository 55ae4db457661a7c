:Œ
J2Softmax_test_softmax_axis_0_expanded_function_axes"Constant*

value 
>
2Softmax_test_softmax_axis_0_expanded_function_axesDiv"ExpB